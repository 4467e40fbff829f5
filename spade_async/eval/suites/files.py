"""GPQA-Diamond: its data is gated and cannot ship (ACEBench, GitHub only: ``acebench``).

The user names the data with ``--data SUITE=PATH``; missing data is one line naming the
file expected and its format (exit 2).
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from spade_async.errors import SpadeError
from spade_async.eval.extract import extract_letter
from spade_async.eval.suites.base import Context, Suite
from spade_async.eval.types import Item, Sampling

__all__ = ["GPQADiamond"]

GPQA_FORMAT = (
    "the GPQA-Diamond file (Hugging Face Idavidrein/gpqa, config gpqa_diamond, 198 rows) as "
    ".csv or .jsonl with columns 'Question', 'Correct Answer', 'Incorrect Answer 1', "
    "'Incorrect Answer 2', 'Incorrect Answer 3'; pass --data gpqa_diamond=PATH"
)
GPQA_PROMPT = (
    "Answer the following multiple choice question. Think step by step, then give the letter "
    "of the correct option as \\boxed{{LETTER}}.\n\n{question}\n\n{options}"
)


class GPQADiamond(Suite):
    """Reference defaults: n 8, temperature 0.7, top_p 0.95, 32,768 tokens; options shuffled
    with ``random.Random(42)``; letters read from ``\\boxed{C}``, ``\\boxed{\\text{C}}``,
    "the answer is (C)"."""

    name = "gpqa_diamond"
    sampling = Sampling(n=8, temperature=0.7, top_p=0.95, max_tokens=32768)

    def __init__(self, path: str | None) -> None:
        self.path = path

    def _rows(self) -> list[dict]:
        p = Path(self.path or "")
        if not self.path or not p.is_file():
            raise SpadeError(f"suite gpqa_diamond has no data file: expected {GPQA_FORMAT}")
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".csv":
            return list(csv.DictReader(text.splitlines()))
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise SpadeError(f"{p}:{n}: not a JSON line; expected {GPQA_FORMAT}") from None
        return rows

    def load(self, limit: int) -> list[Item]:
        rng = random.Random(42)
        items = []
        for n, row in enumerate(self._rows(), 1):
            try:
                right = row["Correct Answer"].strip()
                options = [right] + [row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)]
                question = row["Question"].strip()
            except (KeyError, AttributeError):
                raise SpadeError(
                    f"{self.path} row {n}: missing columns; expected {GPQA_FORMAT}"
                ) from None
            rng.shuffle(options)
            letter = "ABCD"[options.index(right)]
            text = "\n".join(f"({'ABCD'[i]}) {o}" for i, o in enumerate(options))
            items.append(Item(
                id=str(row.get("Record ID") or f"gpqa-{n}"),
                messages=[{"role": "user", "content": GPQA_PROMPT.format(question=question, options=text)}],
                answer=letter,
            ))  # fmt: skip
        return items[:limit] if limit else items

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        letter = extract_letter(completion)
        return letter, 1.0 if letter == item.answer else 0.0
