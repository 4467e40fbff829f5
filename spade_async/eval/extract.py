"""Answer extractors: the last ``\\boxed{}`` (nested braces), letters, tags, code fences."""

from __future__ import annotations

import re

__all__ = [
    "last_boxed",
    "strip_wrappers",
    "extract_letter",
    "reference_letter",
    "final_region",
    "last_answer_tag",
    "last_code_block",
    "code_blocks",
]

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


def boxed_spans(text: str) -> list[tuple[int, str]]:
    """``(position, contents)`` of every complete, non-empty ``\\boxed{...}``, in order."""
    out = []
    for m in _BOXED.finditer(text or ""):
        inner = _balanced(text, m.end())
        if inner is not None and inner.strip():
            out.append((m.start(), inner.strip()))
    return out


def last_boxed(text: str) -> str | None:
    """Contents of the last complete ``\\boxed{...}`` (braces may nest), stripped. An empty
    box ("I put my answer within \\boxed{} as asked") is an echo of the instruction, never
    the answer."""
    spans = boxed_spans(text)
    return spans[-1][1] if spans else None


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


_THINK_END = re.compile(r"</think>", re.I)


def final_region(text: str) -> str:
    """What follows the last ``</think>`` (the final answer), or all of ``text``."""
    parts = _THINK_END.split(text or "")
    return parts[-1] if len(parts) > 1 else (text or "")


# --- multiple choice ---------------------------------------------------------------------
# The reference's GPQA extraction (eval_offline/suites/gpqa_diamond.py), kept verbatim in
# behaviour: the last \boxed{A-D} (bare letter only), else the FIRST "answer is X" /
# "Answer: X" (case-insensitive, so "answer is a" reads as A).
_REF_BOXED = re.compile(r"\\boxed\{([A-D])\}")
_REF_LETTER = re.compile(r"(?:answer is|Answer:)\s*([A-D])\b", re.IGNORECASE)


def reference_letter(text: str) -> str | None:
    """The reference SPADE's GPQA letter, exactly (for numbers comparable to the paper)."""
    m = _REF_BOXED.findall(text or "")
    if m:
        return m[-1].upper()
    m2 = _REF_LETTER.search(text or "")
    return m2.group(1).upper() if m2 else None


_ADVERB = r"(?:(?:definitely|clearly|most\s+likely|likely|probably|indeed|therefore|thus|then|now|still)\s+)?"
_CHOICE_WORD = r"(?:(?:option|choice|letter)\s+)?"
# "the answer is (C)", "Final answer: **D**", "the correct option is definitely C", "answer: $\boxed{B}$"
_PHRASE = re.compile(
    r"(?:answer|option|choice)\s*(?:is|:|=|would\s+be|should\s+be|must\s+be)\s*[:\-]?\s*"
    + _ADVERB
    + _CHOICE_WORD
    + r"[\*_\s]*[\(\[]?\s*[\*_]*([A-D])(?![A-Za-z0-9'])",
    re.I,
)
# a line that is only the letter: "**D**", "**(C)**", "(B)", "D.", "Answer: **A**"
_LINE = re.compile(
    r"^[\s>#\*_]*(?:(?:final\s+)?answer\s*[:\-]?\s*)?"
    + _CHOICE_WORD
    + r"[\*_\s]*[\(\[]?\s*[\*_]*([A-D])[\*_]*\s*[\)\]]?[\*_\s.]*$",
    re.I | re.M,
)
# "Option C is correct", "(B) is the right answer", "I choose D", "I'll go with option A"
_VERDICT = re.compile(
    r"(?:\b(?:option|choice)\s+)?\(?\b([A-D])\)?\s+is\s+(?:the\s+)?(?:correct|right|best)\b"
    r"|\bI(?:\s+would|\s+will|'ll|'d)?\s+(?:choose|pick|select|go\s+with)\s+"
    + _CHOICE_WORD
    + r"\(?([A-D])\b(?!['-])",
    re.I,
)
_BOX_LETTER = re.compile(r"^(?:option\s+|choice\s+)?\(?([A-D])\)?(?:[.:)]\s*(.*))?$", re.I | re.S)
_MORE_LETTERS = re.compile(r"(?:\band\b|\bor\b|&|,|/|\+)\s*\(?[A-D]\b|\([A-D]\)")


def _box_letter(content: str, letters: str) -> str | None:
    """One letter from a box: ``C``, ``\\text{C}``, ``(C)``, ``C. 42 m/s``, ``option C``; not
    ``B and D``, ``A, C`` or ``E``."""
    s = strip_wrappers(content).strip().rstrip(".")
    m = _BOX_LETTER.match(s)
    if m is None or m.group(1).upper() not in letters:
        return None
    if m.group(1).islower() and len(s) > 1 and not s.startswith("("):
        return None  # "a. ..." is prose more often than an option
    rest = m.group(2) or ""
    if _MORE_LETTERS.search(rest):
        return None
    return m.group(1).upper()


def _letters_in(text: str, letters: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for pos, content in boxed_spans(text):
        letter = _box_letter(content, letters)
        if letter is not None:
            found.append((pos, letter))
        else:
            found.append((pos, ""))  # a box that names no single option still counts as final
    for pat in (_PHRASE, _LINE, _VERDICT):
        for m in pat.finditer(text):
            group = next(g for g in range(1, (pat.groups or 0) + 1) if m.group(g) is not None)
            letter = m.group(group)
            if letter.isupper() and letter in letters:  # "answer a question" is not option A
                found.append((m.start(group), letter))
    return sorted(found)


def extract_letter(text: str, letters: str = "ABCD") -> str | None:
    """The multiple-choice letter a careful reader takes as the final answer: the last of
    ``\\boxed{C}`` (also ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``, ``\\boxed{C. text}``),
    "the answer is (C)" / "the answer is definitely C" / "Answer: **C**", "Option C is
    correct" / "I choose C", or a last line that is only the letter (``**D**``, ``**(C)**``), looked for after the last ``</think>`` first
    (a final answer beats a box inside the thinking). The option letter is a capital: the
    word "a" is never option A. A box naming no single option (``\\boxed{B and D}``), if it
    is the last candidate, gives None."""
    for region in (final_region(text), text or ""):
        found = _letters_in(region, letters)
        if found:
            return found[-1][1] or None
    return None


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_PLACEHOLDERS = {"answer here", "your answer", "your answer here", "...", "answer"}


def last_answer_tag(text: str) -> str | None:
    """The last ``<answer>...</answer>`` that holds an answer, falling back to the last
    ``\\boxed{}``. An empty tag, or one that only echoes the prompt's format placeholder
    ("<answer>answer here</answer>"), is not an answer; a tag holding just ``\\boxed{X}``
    (the prompt asks for both) is ``X``."""
    for raw in reversed(_ANSWER_TAG.findall(text or "")):
        inner = raw.strip()
        if not inner or inner.lower().strip(" .<>") in _PLACEHOLDERS:
            continue
        unwrapped = inner.strip("$").strip()
        m = _BOXED.match(unwrapped)
        if m is not None:
            boxed = _balanced(unwrapped, m.end())
            if boxed is not None and boxed.strip() and m.end() + len(boxed) + 1 == len(unwrapped):
                return boxed.strip()
        return inner
    return last_boxed(text or "")


_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[ \t]*\n(.*?)```", re.S)
_NOT_PYTHON = {"text", "txt", "bash", "sh", "shell", "console", "output", "json", "plaintext"}


def code_blocks(text: str) -> list[str]:
    """Every fenced block in order: ```` ``` ````, ```` ```python ````, ```` ```python3 ````,
    ```` ```py ````; blocks tagged as another language (``text``, ``bash``, ``output``...)
    are left out."""
    return [body for tag, body in _FENCE.findall(text or "") if tag.lower() not in _NOT_PYTHON]


def last_code_block(text: str) -> str | None:
    """The last fenced Python (or untagged) code block, else None."""
    found = code_blocks(text)
    return found[-1] if found else None
