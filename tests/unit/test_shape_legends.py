"""Every module that names tensors by their shape letters (``hidden_TD``, ``ids_RLK``) says
what each letter means in its docstring's legend ("Legend:" or "Shape legend:")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = re.compile(r"\b[a-z][a-z0-9_]*?_([A-Z]{1,4})\b")
# suffixes that are symbols, not shapes: peft's adapter halves, a gradient w.r.t. the entropy H
# and w.r.t. the head weight W
NOT_SHAPES = ("lora_A", "lora_B", "g_H", "grad_W")
LEGEND = re.compile(r"(?:Shape legend|Legend):(.*?)(?:\n\s*\n|\"\"\")", re.S)
MODULES = sorted([*(ROOT / "spade_async").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])


def letters_used(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in SUFFIX.finditer(text):
        if not m.group(0).endswith(NOT_SHAPES):
            for ch in m.group(1):
                out.setdefault(ch, m.group(0))
    return out


def letters_defined(text: str) -> set[str] | None:
    m = LEGEND.search(text)
    return None if m is None else set(re.findall(r"\b([A-Z])\b(?=\s+\S)", m.group(1)))


def missing(text: str) -> dict[str, str]:
    used, defined = letters_used(text), letters_defined(text) or set()
    return {ch: name for ch, name in used.items() if ch not in defined}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shape_letter_is_in_the_legend(path):
    gaps = missing(path.read_text())
    assert not gaps, f"letters without a legend entry (letter: first use): {gaps}"


def test_the_check_sees_a_missing_letter():
    text = '"""Sums.\n\nLegend: T tokens.\n"""\n\nx_TV = 1\ny_T = 2\n'
    assert missing(text) == {"V": "x_TV"}
    assert missing(text.replace("T tokens.", "T tokens, V vocabulary.")) == {}
    assert missing("z_BT = 0\n") == {"B": "z_BT", "T": "z_BT"}  # no legend at all
