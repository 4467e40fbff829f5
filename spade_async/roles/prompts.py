"""Prompt text for the designer and the hint writer. Plain functions over plain data.

The designer prompt follows SPADE.md step 1: a target skill, one grounding document, the
environment contract for the setting, and memory examples (same-skill positives to move away
from, one named negative). One-shot question/answer environments are forbidden.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SKILLS = (
    "Mathematical_Reasoning",
    "Logical_Deduction",
    "Spatial_Reasoning",
    "Pattern_Recognition",
    "Optimization",
    "Causal_Inference",
)

GAMES_CONTRACT = """\
Write ONE Python file, standard library only, containing exactly one class whose name ends in `Env`:
- `__init__(self, max_turns: int = 20, **kwargs)` works with no arguments.
- `reset(self, seed: int | None = None) -> tuple[str, dict]`: first observation (non-empty text
  explaining the goal and the command format) and an info dict. Hidden state comes from
  `random.Random(seed)`; the same seed gives the same episode.
- `step(self, action: str) -> tuple[str, float, bool, bool, dict]`: observation, reward,
  terminated, truncated, info. The agent replies with text containing one command as
  `\\boxed{command}`; extract it with `re.search(r'\\\\boxed\\{(.+?)\\}', action)` and handle a
  missing or invalid command gracefully (never raise). Reward: partial progress in [0, 1],
  exactly 1.0 for full success; `truncated` becomes True after `max_turns` steps.
- `solution(self) -> list[str]`: the actions (each written as `\\boxed{...}`) that solve the
  current episode from its reset state.
The goal must need SEVERAL actions: hidden state is revealed by acting and the agent must
use what each observation tells it. A one-shot question/answer environment is forbidden."""

TOOL_USE_CONTRACT = """\
Write ONE Python file, standard library only, containing exactly one class
`SomethingEnv(ToolUseBaseEnv)` (ToolUseBaseEnv is provided; do not import it):
- `reset(self, seed=None) -> tuple[str, dict]` builds the hidden task data from
  `random.Random(seed)`, sets `self._expected_answer`, and returns the task description.
- Declare tools in `self._tools = {name: {"description": str, "parameters": <JSON schema>}}`
  and implement one `tool_<name>(self, **kwargs) -> str` method per tool.
- `solution(self) -> list[str]`: the actions that solve the episode, each either
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` or `<answer>...</answer>`.
The answer must need information that only the tools reveal, over several calls."""


def designer_prompt(
    *,
    skill: str,
    setting: str,
    document: str | None,
    positives: Sequence[tuple[str, float, float]] = (),
    negative: tuple[str, str] | None = None,
    difficulty: str = "challenging but solvable",
) -> str:
    """``positives``: (code head, win rate, regret); ``negative``: (code head, why it failed)."""
    parts = [
        f"You are an environment designer. Design a new multi-turn {setting.replace('_', ' ')} "
        f"training environment that exercises the skill **{skill}** and is {difficulty} for a "
        "capable reasoning agent.",
    ]
    if document:
        parts.append(
            "Ground the environment in the following document: take its entities, facts or "
            f"procedures as the environment's theme and data.\n\n<document>\n{document}\n</document>"
        )
    parts.append("## Contract\n" + (TOOL_USE_CONTRACT if setting == "tool_use" else GAMES_CONTRACT))
    if positives:
        shown = "\n\n".join(
            f"# Example {i + 1} (agent win rate {w:.2f}, regret {r:.2f})\n{code}"
            for i, (code, w, r) in enumerate(positives)
        )
        parts.append(
            "## Environments that worked well (create a DIFFERENT environment, not a variant)\n"
            + shown
        )
    if negative:
        code, why = negative
        parts.append(f"## An environment that did NOT work ({why}); avoid its mistake\n{code}")
    parts.append("Reply with the complete file in one ```python code block.")
    return "\n\n".join(parts)


def repair_prompt(stage: str, reason: str) -> str:
    return (
        f"Your environment failed validation at stage '{stage}': {reason}\n"
        "Fix it and reply with the complete corrected file in one ```python code block."
    )


HINT_SYSTEM = (
    "You write short strategic hints for a player of a text environment. You see the "
    "environment's source code. Explain the rules, the command format and a good strategy. "
    "NEVER reveal the answer, the hidden values, or the exact sequence of winning actions: "
    "a hint that leaks the solution is useless and will be discarded."
)


def hint_prompt(code: str) -> str:
    return (
        "Here is the environment's source code:\n\n```python\n"
        f"{code}\n```\n\nWrite a hint of at most 5 sentences."
    )


def leaks_solution(
    hint: str, solution_actions: Sequence[str], expected_answer: str | None = None
) -> bool:
    """True when the hint quotes the solution: its whole action sequence in order, or the answer.

    Actions are compared by payload (the text inside ``\\boxed{}`` / ``<answer>``) as whole
    words, so a hint that names the command format (``\\boxed{guess N}``) is not a leak, but
    one that spells out every winning move in order is.
    """
    text = " ".join(hint.lower().split())
    payloads = [p for p in (_payload(a) for a in solution_actions) if p]
    if payloads and (len(payloads) > 1 or len(payloads[0]) >= 2):
        pos = 0
        for p in payloads:
            m = re.compile(rf"(?<!\w){re.escape(p)}(?!\w)").search(text, pos)
            if m is None:
                break
            pos = m.end()
        else:
            return True
    if expected_answer is not None:
        ans = " ".join(str(expected_answer).lower().split())
        if len(ans) >= 2 and re.search(rf"(?<!\w){re.escape(ans)}(?!\w)", text):
            return True
    return False


def _payload(action: str) -> str:
    a = action.strip()
    m = re.search(r"\\boxed\{(.+?)\}", a) or re.search(r"<answer>(.*?)</answer>", a, re.S)
    return " ".join((m.group(1) if m else a).lower().split())
