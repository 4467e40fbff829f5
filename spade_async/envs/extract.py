"""Python code from a model's reply.

- Fenced blocks (```python, ```py, ``` with no language, ~~~ fences): with several, the
  one that defines a class named ``...Env`` wins (the last such, as a revised version
  usually comes last), else the longest; blocks labelled with another language are skipped.
- An unterminated fence (the model ran out of tokens) still yields its content.
- No fence: the reply itself when it parses as Python with a top-level def/class/import
  (stripping prose lines before the first code line).
- Otherwise ``None``.
"""

from __future__ import annotations

import ast
import re

__all__ = ["extract_code"]

_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+#.-]*)[^\n]*\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_ENV_CLASS = re.compile(r"^class\s+\w*Env\b", re.MULTILINE)
_CODE_START = re.compile(r"^(?:from\s+\w|import\s+\w|class\s+\w|def\s+\w|@\w|#!)", re.MULTILINE)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def extract_code(reply: str) -> str | None:
    """The environment source in ``reply``, or None when there is no code."""
    if not reply or not reply.strip():
        return None
    blocks = [
        m.group("body").strip("\n")
        for m in _FENCE.finditer(reply)
        if m.group("lang").lower() in _PY_LANGS
    ]
    blocks = [b for b in blocks if b.strip()]
    if blocks:
        with_env = [b for b in blocks if _ENV_CLASS.search(b)]
        if with_env:
            return with_env[-1].rstrip() + "\n"
        return max(blocks, key=len).rstrip() + "\n"
    if "```" in reply or "~~~" in reply:
        return None  # only fences of other languages
    start = _CODE_START.search(reply)
    if start is None:
        return None
    code = reply[start.start() :].rstrip() + "\n"
    return code if _parses(code) else None
