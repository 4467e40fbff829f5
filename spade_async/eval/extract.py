"""Answer extractors: the last ``\\boxed{}`` (nested braces), letters, tags, code fences."""

from __future__ import annotations

import re

__all__ = ["last_boxed", "strip_wrappers", "extract_letter", "last_answer_tag", "last_code_block"]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|textit|mbox|operatorname)\s*\{")


def _balanced(text: str, start: int) -> str | None:
    """Contents of the brace group opening just before ``start``, or None if unbalanced."""
    depth = 1
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Contents of the last complete ``\\boxed{...}`` (braces may nest), stripped."""
    for m in reversed(list(_BOXED.finditer(text or ""))):
        inner = _balanced(text, m.end())
        if inner is not None:
            return inner.strip()
    return None


def strip_wrappers(answer: str) -> str:
    """``\\text{C}`` -> ``C``, repeatedly; also surrounding ``$`` and ``( )``."""
    s = answer.strip().strip("$").strip()
    while (m := _WRAPPER.match(s)) is not None:
        inner = _balanced(s, m.end())
        if inner is None or m.end() + len(inner) + 1 != len(s):
            break  # e.g. "\\text{A} and \\text{B}": not one wrapper around everything
        s = inner.strip()
    if len(s) == 3 and s[0] == "(" and s[2] == ")":
        s = s[1]
    return s


_LETTER_PATTERNS = [
    re.compile(r"answer\s*(?:is|:)?\s*[:\s]*\(?\**\s*([A-D])\b\)?", re.I),
    re.compile(r"^\s*\(?([A-D])\)?\s*$", re.M),
]


def extract_letter(text: str, letters: str = "ABCD") -> str | None:
    """Multiple-choice letter: ``\\boxed{C}``, ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``,
    then "the answer is (C)"; the last occurrence wins."""
    boxed = last_boxed(text or "")
    if boxed is not None:
        s = strip_wrappers(boxed).upper()
        if len(s) == 1 and s in letters:
            return s
        m = re.match(r"^\(?([A-Z])\)?[\s.:)]", s + " ")
        if m and m.group(1) in letters:
            return m.group(1)
    for pat in _LETTER_PATTERNS:
        found = [g.upper() for g in pat.findall(text or "") if g.upper() in letters]
        if found:
            return found[-1]
    return None


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def last_answer_tag(text: str) -> str | None:
    """Last ``<answer>...</answer>``, falling back to the last ``\\boxed{}``."""
    found = _ANSWER_TAG.findall(text or "")
    if found:
        return found[-1].strip()
    return last_boxed(text or "")


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)```", re.S)


def last_code_block(text: str) -> str | None:
    """The last fenced code block (``` or ```python), else None."""
    found = _FENCE.findall(text or "")
    return found[-1] if found else None
