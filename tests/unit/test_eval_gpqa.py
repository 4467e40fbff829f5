"""GPQA-Diamond: the reference's prompt and option order; two extraction modes on hand-made
completions: ``robust`` (what a careful reader takes as the final answer) and ``reference``
(the reference's exact regexes, so numbers compare with the paper's)."""

from __future__ import annotations

import json
import random
import re

import anyio
import pytest

from spade_async.errors import SpadeError
from spade_async.eval.extract import extract_letter, reference_letter
from spade_async.eval.suites import make_suite
from spade_async.eval.suites.files import gpqa_prompt

# (completion, careful reader / robust, the reference's extraction)
CASES = [
    ("\\boxed{C}", "C", "C"),
    ("so it is \\boxed{\\text{C}}", "C", None),  # the reference's bare regex misses it
    ("To answer a question like this, compare the rates. The answer is C.", "C", "C"),
    ("Answer: a quick estimate gives 5 eV, so the answer is C", "C", "A"),  # "a" is no option
    ("<think>Maybe \\boxed{A}? No.</think>\nThe final answer is B.", "B", "A"),
    ("Both hold, so \\boxed{B and D}", None, None),
    ("\\boxed{A, C}", None, None),
    ("Comparing the options above, only one fits.\n\n**D**", "D", None),
    ("So we pick\n**(C)**", "C", None),
    ("After all that, the answer is definitely C", "C", None),
    ("The answer is (B).", "B", None),
    ("Answer: B", "B", "B"),
    ("First \\boxed{A} ... wait, I made an error. Redo: \\boxed{D}", "D", "D"),
    ("\\boxed{(D)}", "D", None),
    ("\\boxed{A. 42 m/s}", "A", None),
    ("The correct option is C.", "C", None),
    ("Final answer: **A**", "A", None),
    ("I am not sure.", None, None),
    ("\\boxed{E}", None, None),
    ("The answer is not A; it is \\boxed{C}.", "C", "C"),
    ("$\\boxed{B}$", "B", "B"),
    ("Options A and B are wrong, D too. The answer is C", "C", "C"),
    ("</think>\n\\boxed{\\textbf{(B)}}", "B", None),
    ("The answer is a tricky one, but I'd go with \\boxed{C}", "C", "C"),
    ("<think>the answer is D</think>\nAfter checking again: **Answer: B**", "B", "D"),
    ("Thus the final answer is $\\boxed{\\text{(C)}}$.", "C", None),
    ("I put my answer within \\boxed{} as asked: \\boxed{A}", "A", "A"),
    ("Therefore, the answer is: D", "D", None),
    ("Checking each one, option C is correct.", "C", None),
    ("(B) is the right answer here.", "B", None),
    ("After weighing them, I choose D.", "D", None),
    ("I'll go with option A", "A", None),
    ("ANSWER: C", "C", "C"),
    ("The correct answer is **C**.", "C", None),
    ("Option A is wrong and B is wrong, so the answer is D.", "D", "D"),
    ("The answer is C. To answer a follow-up you might have: the rate doubles.", "C", "C"),
]


def test_at_least_twenty_hand_made_completions():
    assert len(CASES) >= 20


@pytest.mark.parametrize(("text", "human", "_"), CASES)
def test_robust_extraction_is_the_careful_reader_s(text, human, _):
    assert extract_letter(text) == human


@pytest.mark.parametrize(("text", "_", "ref"), CASES)
def test_reference_mode_is_the_reference_s_regexes(text, _, ref):
    assert reference_letter(text) == ref


def _reference_extract(text):
    """The reference's ``_extract_letter`` (eval_offline/suites/gpqa_diamond.py), as an
    independent oracle for ``reference_letter`` on the same completions."""
    m = re.findall(r"\\boxed\{([A-D])\}", text)
    if m:
        return m[-1].upper()
    m2 = re.search(r"(?:answer is|Answer:)\s*([A-D])\b", text, re.IGNORECASE)
    return m2.group(1).upper() if m2 else None


def test_reference_mode_equals_the_reference_code_on_every_case():
    assert [reference_letter(t) for t, *_ in CASES] == [_reference_extract(t) for t, *_ in CASES]


ROWS = [
    {"Record ID": f"r{i}", "Question": f"Question {i}?", "Correct Answer": f"right {i}",
     "Incorrect Answer 1": f"w1 {i}", "Incorrect Answer 2": f"w2 {i}",
     "Incorrect Answer 3": f"w3 {i}"}
    for i in range(6)
]  # fmt: skip


def _write(tmp_path, rows):
    f = tmp_path / "gpqa.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_prompt_and_option_order_are_the_reference_s(tmp_path):
    items = make_suite("gpqa_diamond", {"gpqa_diamond": str(_write(tmp_path, ROWS))}).load(0)
    rng = random.Random(42)  # the reference's loader, step by step
    for row, item in zip(ROWS, items, strict=True):
        choices = [row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        order = list(range(4))
        rng.shuffle(order)
        shuffled = [choices[j] for j in order]
        assert item.answer == "ABCD"[order.index(0)]
        want = (
            f"{row['Question']}\n\nA. {shuffled[0]}\nB. {shuffled[1]}\nC. {shuffled[2]}\n"
            f"D. {shuffled[3]}\n\nPlease reason step by step, and put your final answer within "
            "\\boxed{}. Specifically, you should provide your final answer in the format "
            "\\boxed{LETTER} where LETTER is one of ABCD."
        )
        assert item.messages == [{"role": "user", "content": want}]
    assert gpqa_prompt("Q", ["a", "b", "c", "d"]).startswith("Q\n\nA. a\nB. b\nC. c\nD. d\n\n")


def test_both_modes_score_through_the_suite(tmp_path):
    path = str(_write(tmp_path, ROWS[:1]))
    robust = make_suite("gpqa_diamond", {"gpqa_diamond": path})
    ref = make_suite("gpqa_diamond", {"gpqa_diamond": path, "gpqa_diamond.extract": "reference"})
    item = robust.load(0)[0]
    text = f"so it is \\boxed{{\\text{{{item.answer}}}}}"
    assert anyio.run(robust.score, item, text, None) == (item.answer, 1.0)
    assert anyio.run(ref.score, item, text, None) == (None, 0.0)
    with pytest.raises(SpadeError, match="extract=robust|reference"):
        make_suite("gpqa_diamond", {"gpqa_diamond": path, "gpqa_diamond.extract": "loose"})


@pytest.mark.parametrize("field", ["Question", "Correct Answer", "Incorrect Answer 3"])
def test_a_missing_field_names_file_line_and_field(tmp_path, field):
    rows = [dict(r) for r in ROWS[:3]]
    del rows[2][field]
    f = _write(tmp_path, rows)
    with pytest.raises(SpadeError) as err:
        make_suite("gpqa_diamond", {"gpqa_diamond": str(f)}).load(0)
    msg = str(err.value)
    assert "\n" not in msg and f"{f}:3" in msg and f"'{field}'" in msg


def test_a_csv_row_with_an_empty_field_names_its_line(tmp_path):
    f = tmp_path / "gpqa.csv"
    head = "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
    f.write_text(head + 'r0,"Multi\nline?",x,y,z,w\nr1,Q?,,y,z,w\n')
    with pytest.raises(SpadeError, match=f"{f}:4: field 'Correct Answer'"):
        make_suite("gpqa_diamond", {"gpqa_diamond": str(f)}).load(0)
