"""Answer extractors on hand-made cases: right, wrong, malformed, nested, \\dfrac, \\text, unicode."""

import pytest

from spade_async.eval.extract import (
    extract_letter,
    last_answer_tag,
    last_boxed,
    last_code_block,
    strip_wrappers,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\dfrac{1}{2}}", "\\dfrac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{ \\text{C} }", "\\text{C}"),
        ("answer: \\boxed{π/2} ✓", "π/2"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{5} and an unclosed \\boxed{6", "5"),
        ("no box here", None),
        ("\\boxed{", None),
        ("", None),
    ],
)
def test_last_boxed(text, want):
    assert last_boxed(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("\\boxed{C}", "C"),
        ("\\boxed{\\text{C}}", "C"),  # the reference's bare regex misses this one
        ("\\boxed{\\textbf{B}}", "B"),
        ("\\boxed{(D)}", "D"),
        ("\\boxed{A. the first option}", "A"),
        ("The answer is (B).", "B"),
        ("after thought, the answer is: C", "C"),
        ("Answer: **A**", "A"),
        ("\\boxed{E}", None),
        ("I am not sure.", None),
    ],
)
def test_extract_letter(text, want):
    assert extract_letter(text) == want


def test_strip_wrappers_only_whole_wrappers():
    assert strip_wrappers("\\text{\\textbf{x}}") == "x"
    assert strip_wrappers("\\text{A} and \\text{B}") == "\\text{A} and \\text{B}"
    assert strip_wrappers("$12$") == "12"


def test_answer_tag_and_fallback():
    assert last_answer_tag("<answer>1</answer> x <answer> 2 </answer>") == "2"
    assert last_answer_tag("no tag but \\boxed{3}") == "3"
    assert last_answer_tag("<answer>unclosed") is None


def test_code_block():
    assert last_code_block("```python\na = 1\n```\n```\nb = 2\n```") == "b = 2\n"
    assert last_code_block("```py\nx\n```") == "x\n"
    assert last_code_block("def f(): pass") is None
