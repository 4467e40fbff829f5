"""The replayable actions of a ``solution()`` value: the one rule the gates, the hint writer,
the audits and every export use.

Standard library only and self-contained: the gymnasium export copies this module's body
into the package it writes (``memory/package.py``), so an exported environment replays its
solution by the same rule without spade-async installed.
"""

from __future__ import annotations

import re

_TAGGED = re.compile(r"<tool_call>.*?</tool_call>|<answer>.*?</answer>", re.DOTALL)


def solution_actions(value: str | list[str]) -> list[str] | None:
    """Replayable actions from ``solution()``: a list as is (each item as text), tool calls
    and answers of a tool-use solution, or lines that each hold a ``\\boxed{...}`` command;
    None when it is free-text guidance (feasibility then "unverified")."""
    if isinstance(value, list):
        return [v if isinstance(v, str) else str(v) for v in value]
    if "<tool_call>" in value or "<answer>" in value:
        return _TAGGED.findall(value) or None
    lines = [ln.strip() for ln in value.splitlines() if ln.strip()]
    if lines and all("\\boxed{" in ln for ln in lines):
        return lines
    return None
