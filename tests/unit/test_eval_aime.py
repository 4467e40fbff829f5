"""AIME on hand-made completions: our score equals a careful reader's, and equals the
reference's scorer (its ``\\boxed{[^{}]+}`` regex, then math-verify) wherever that scorer
agrees with the reader; the prompt is the problem and the instruction joined by "\\n"."""

from __future__ import annotations

import re

import anyio
import pytest

from spade_async.eval.checker import Checker
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.suites.math import MATH_INSTRUCTION
from spade_async.eval.types import Item

# (completion, gold, careful reader's score, does the reference's scorer agree?)
CASES = [
    ("so the answer is \\boxed{70}.", "70", 1.0, True),
    ("\\boxed{070}", "70", 1.0, True),
    ("The answer is \\boxed{204}. I put my answer within \\boxed{} as asked.", "204", 1.0, True),
    ("I put my answer within \\boxed{} as asked: \\boxed{204}", "204", 1.0, True),
    ("\\boxed{204}\\boxed{}", "204", 1.0, True),
    ("I will write \\boxed{} at the end.", "204", 0.0, True),
    ("\\boxed{33}", "34", 0.0, True),
    ("no box, but the answer is 70", "70", 0.0, True),  # the format asks for a box
    ("\\boxed{\\text{70}}", "70", 1.0, False),  # [^{}]+ cannot read a nested brace
    ("\\boxed{1} first, then corrected: \\boxed{2}", "2", 1.0, True),
    ("\\boxed{ 512 }", "512", 1.0, True),
    ("\\boxed{5\\sqrt{2}}", "7", 0.0, True),
    ("$\\boxed{113}$", "113", 1.0, True),
    ("\\boxed{113.0}", "113", 1.0, True),
    ("\\boxed{\\frac{226}{2}}", "113", 1.0, False),  # nested braces again
    ("\\boxed{226/2}", "113", 1.0, True),
    ("\\boxed{-113}", "113", 0.0, True),
    ("<think>maybe \\boxed{12}</think> final: \\boxed{13}", "13", 1.0, True),
    ("\\fbox{25}", "25", 1.0, False),  # the reference reads \\boxed only
    ("\\boxed{25} \\quad (m + n = 25)", "25", 1.0, True),
    ("\\boxed{0}", "0", 1.0, True),
    ("\\boxed{}", "0", 0.0, True),
    ("The final answer is \\boxed{ 6 }.", "6", 1.0, True),
    ("\\boxed{2^{10}}", "1024", 1.0, False),
]


def reference_score(completion: str, gold: str) -> float:
    """The reference's AIME scorer (eval_offline/suites/aime.py): last ``\\boxed{[^{}]+}``,
    math-verify on ``\\boxed{label}`` vs ``\\boxed{pred}``, int/str compare if it raises."""
    from math_verify import parse, verify

    found = re.findall(r"\\boxed\{([^{}]+)\}", completion)
    if not found:
        return 0.0
    pred = found[-1].strip()
    try:
        return float(bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{pred}}}"))))
    except Exception:  # noqa: BLE001 - the reference's own fallback
        try:
            return float(int(pred) == int(gold))
        except ValueError:
            return float(pred == gold)


def test_twenty_hand_made_completions_score_as_a_careful_reader_and_the_reference():
    assert len(CASES) >= 20
    suite = make_suite("aime25")

    async def main():
        with Checker(workers=1) as checker:
            ctx = Context(None, checker, None, None)
            return [
                (await suite.score(Item(id=str(i), messages=[], answer=gold), text, ctx))[1]
                for i, (text, gold, _, _) in enumerate(CASES)
            ]

    ours = anyio.run(main)
    assert ours == [c[2] for c in CASES]
    ref = [reference_score(text, gold) for text, gold, _, _ in CASES]
    for (text, _, human, agrees), r in zip(CASES, ref, strict=True):
        assert (r == human) is agrees, text  # the flags above are the reference's real verdicts


def test_prompt_joins_problem_and_instruction_with_one_newline():
    item = make_suite("aime25").load(1)[0]
    text = item.messages[0]["content"]
    assert text.endswith("\n" + MATH_INSTRUCTION) and not text.endswith("\n\n" + MATH_INSTRUCTION)
    assert (
        MATH_INSTRUCTION
        == "Please reason step by step, and put your final answer within \\boxed{}."
    )


@pytest.mark.parametrize("year", [24, 25, 26])
def test_thirty_problems_a_year(year):
    assert len(make_suite(f"aime{year}").load(0)) == 30
