"""GPQA-Diamond: its data is gated and cannot ship (ACEBench, GitHub only: ``acebench``).

The user names the data with ``--data SUITE=PATH``; missing data is one line naming the
file expected and its format (exit 2).
"""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

from spade_async.errors import SpadeError
from spade_async.eval.extract import extract_letter, reference_letter
from spade_async.eval.suites.base import Context, Suite
from spade_async.eval.types import Item, Sampling

__all__ = ["GPQADiamond", "gpqa_prompt"]

GPQA_FORMAT = (
    "the GPQA-Diamond file (Hugging Face Idavidrein/gpqa, config gpqa_diamond, 198 rows) as "
    ".csv or .jsonl with columns 'Question', 'Correct Answer', 'Incorrect Answer 1', "
    "'Incorrect Answer 2', 'Incorrect Answer 3'; pass --data gpqa_diamond=PATH"
)
# the reference's prompt (eval_offline/suites/gpqa_diamond.py, "matches boxed_qa_env.py")
GPQA_INSTRUCTION = (
    "Please reason step by step, and put your final answer within \\boxed{}. Specifically, "
    "you should provide your final answer in the format \\boxed{LETTER} where LETTER is one "
    "of ABCD."
)
FIELDS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
          "Incorrect Answer 3")  # fmt: skip


def gpqa_prompt(question: str, options: list[str]) -> str:
    """The reference's user message: the question, ``A. ...`` options, the instruction."""
    opts = "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options))
    return f"{question}\n\n{opts}\n\n{GPQA_INSTRUCTION}"


class GPQADiamond(Suite):
    """Reference defaults: n 8, temperature 0.7, top_p 0.95, 32,768 tokens; the options are
    shuffled with one ``random.Random(42)`` over the rows in file order, as the reference
    does (the same permutation: it shuffles indices, we shuffle the options).

    ``gpqa_diamond.extract``: ``robust`` (default; ``extract.extract_letter``: the final
    answer a careful reader takes) or ``reference`` (the reference's exact regexes,
    ``extract.reference_letter``: for numbers comparable to the paper)."""

    name = "gpqa_diamond"
    sampling = Sampling(n=8, temperature=0.7, top_p=0.95, max_tokens=32768)

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.mode = "robust"

    def configure(self, options: dict[str, str]) -> None:
        for key, value in options.items():
            if key != "extract" or value not in ("robust", "reference"):
                raise SpadeError(f"gpqa_diamond takes extract=robust|reference; got {key}={value}")
            self.mode = value

    def _rows(self) -> list[tuple[int, dict]]:
        """``(line number, row)`` pairs."""
        p = Path(self.path or "")
        if not self.path or not p.is_file():
            raise SpadeError(f"suite gpqa_diamond has no data file: expected {GPQA_FORMAT}")
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".csv":
            reader = csv.DictReader(io.StringIO(text))
            rows = []
            line = 2
            for row in reader:
                rows.append((line, row))
                line = reader.line_num + 1
            return rows
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    raise SpadeError(f"{p}:{n}: not a JSON line; expected {GPQA_FORMAT}") from None
                if not isinstance(row, dict):
                    raise SpadeError(f"{p}:{n}: not a JSON object; expected {GPQA_FORMAT}")
                rows.append((n, row))
        return rows

    def load(self, limit: int) -> list[Item]:
        rng = random.Random(42)
        items = []
        for n, (line, row) in enumerate(self._rows(), 1):
            for key in FIELDS:
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise SpadeError(
                        f"{self.path}:{line}: field '{key}' missing or empty; expected {GPQA_FORMAT}"
                    )
            right = row["Correct Answer"]
            options = [right] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
            order = list(range(4))
            rng.shuffle(order)  # the reference's draw: one shuffle of [0, 1, 2, 3] per row
            shuffled = [options[j] for j in order]
            letter = "ABCD"[order.index(0)]
            items.append(Item(
                id=str(row.get("Record ID") or f"gpqa-{n}"),
                messages=[{"role": "user", "content": gpqa_prompt(row["Question"], shuffled)}],
                answer=letter,
            ))  # fmt: skip
        return items[:limit] if limit else items

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        letter = (reference_letter if self.mode == "reference" else extract_letter)(completion)
        return letter, 1.0 if letter == item.answer else 0.0
