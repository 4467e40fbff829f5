"""Prompt text for the designer and the hint writer. Plain functions over plain data.

The designer prompt follows docs/method.md, "One cycle", step 1 and states the whole contract of the reference's
prompts (``spare/core/prompts``) in our own words: a target skill and what it means, one
grounding document, the interface for the setting, the design rules (state that changes,
real decisions, a win condition, random play loses), the robustness rules, how to check the
file before replying, and how the difficulty maps to the number of steps a good player
needs. Memory examples follow (same-skill positives to move away from, one named negative).
One-shot question/answer environments are forbidden.

Hint prompts are per setting (games: the approach and the answer format; tool use: the
phases in terms of tool roles, value-free), with the reference's rule: never the answer.
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

SKILL_MEANINGS = {
    "Mathematical_Reasoning": "computing, estimating and reasoning with quantities, equations "
    "and number patterns over several steps",
    "Logical_Deduction": "drawing sure conclusions from clues and constraints, ruling options "
    "out until one remains",
    "Spatial_Reasoning": "positions, directions, shapes and paths on a grid or map, and how "
    "moves change them",
    "Pattern_Recognition": "finding the hidden rule behind sequences, codes or feedback and "
    "using it to predict",
    "Optimization": "choosing among trade-offs under a budget or limit to reach the best score",
    "Causal_Inference": "testing interventions and reading their effects to find what causes what",
}

# fraction of max_turns a good player needs (the reference asks for 1/2 to 3/4 at 'medium')
DIFFICULTY_STEPS = {"easy": (0.25, 0.5), "medium": (0.5, 0.75), "hard": (0.75, 0.9)}

DESIGN_RULES = """\
## Design rules
- The world has state (positions, inventory, clues found, budget, ...) that every action
  changes; each observation shows the state, the result of the last action, the actions
  available and the progress (turn t of max_turns).
- Every turn offers at least two meaningfully different actions, and some are better than
  others: a wrong choice wastes turns or loses the game. Random play should lose.
- A clear win condition (reward 1.0, terminated) and ideally a way to lose (terminated with
  reward 0.0); after max_turns without a win, truncated with reward 0.0.
- Not a puzzle with retries, not a counter to step up to a target, not a one-action-per-turn
  walk: those teach nothing over several turns.

## Robustness rules (an environment that crashes or hangs is thrown away and costs you)
- step() never raises: unknown or malformed input gets a short reminder of the valid
  actions and the game goes on; every path returns the 5-tuple of the right types.
- Set every attribute in __init__; the info dicts are dicts; never divide by something
  that can be zero; no input(), no files, no network, no threads, standard library only.
- Hidden values come from random.Random(seed) in reset(), and the answer is computed from
  them -- never hard-coded. Do not store data under the name `solution` (it is a method).
- In f-strings, double literal braces ({{ }}) and keep backslashes out of the expressions.

## Check your file before you reply
Trace reset(seed) for two seeds by hand, then replay your own solution() from that state:
it must reach reward 1.0 with terminated True well before max_turns, and a wrong or
malformed action must not end the game or raise."""

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


def difficulty_steps(difficulty: str, max_turns: int) -> tuple[int, int]:
    """The number of steps a good player should need, from the difficulty's share of
    ``max_turns`` (unknown names read as 'medium', the reference's setting)."""
    lo, hi = DIFFICULTY_STEPS.get(difficulty, DIFFICULTY_STEPS["medium"])
    return max(2, int(max_turns * lo)), max(3, int(max_turns * hi))


def designer_prompt(
    *,
    skill: str,
    setting: str,
    document: str | None,
    positives: Sequence[tuple[str, float | None, float | None]] = (),
    negative: tuple[str, str] | None = None,
    difficulty: str = "medium",
    max_turns: int = 25,
) -> str:
    """``positives``: (code head, win rate, regret) -- None for a not-yet-played seed
    example; ``negative``: (code head, why it failed)."""
    meaning = SKILL_MEANINGS.get(skill)
    lo, hi = difficulty_steps(difficulty, max_turns)
    if document:  # the reference's corpus_template.py: 3+ steps, partial rewards for progress
        pace = (
            f"Difficulty: {difficulty}. The goal should take at least 3 interaction steps "
            f"(the agent gets at most {max_turns} turns), reward partial progress along the "
            "way with a final reward between 0 and 1, and make a careless player fail."
        )
    else:  # the no-corpus template's turn share
        pace = (
            f"Difficulty: {difficulty}. The agent gets at most {max_turns} turns; a good player "
            f"should need about {lo}-{hi} of them, and a careless one should fail."
        )
    parts = [
        f"You are an environment designer. Design a new multi-turn {setting.replace('_', ' ')} "
        f"training environment that exercises the skill **{skill}**"
        + (f" ({meaning})" if meaning else "")
        + ". "
        + pace,
    ]
    if document:
        parts.append(
            "Ground the environment in the following document: take its entities, facts or "
            f"procedures as the environment's theme and data.\n\n<document>\n{document}\n</document>"
        )
    parts.append("## Contract\n" + (TOOL_USE_CONTRACT if setting == "tool_use" else GAMES_CONTRACT))
    parts.append(DESIGN_RULES)
    if positives:
        shown = "\n\n".join(
            f"# Example {i + 1} ({_stats(w, r)})\n{code}"
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


def _stats(win: float | None, regret: float | None) -> str:
    if win is None:
        return "not played yet"
    return f"agent win rate {win:.2f}, regret {regret or 0.0:.2f}"


def repair_prompt(stage: str, reason: str) -> str:
    return (
        f"Your environment failed validation at stage '{stage}': {reason}\n"
        "Fix it and reply with the complete corrected file in one ```python code block."
    )


HINT_SYSTEM = (
    "You read the source code of a text game and write a hint for an LLM player, which sees "
    "only the observations and answers with \\boxed{command}; your hint is appended to its "
    "first observation. Work out what the player faces, how a good player wins (trace reset() "
    "and the checks in step()) and the command format. Write 1-3 sentences (under 100 words): "
    "the key insight or strategy for THIS game and the exact command format, in terms of what "
    "the player can see, never code internals. Never reveal the answer, the hidden values or "
    "the winning sequence of moves: a hint that can be copied trains the designer to make "
    "games that need the leak. Output only the hint text."
)

TOOL_USE_HINT_SYSTEM = (
    "You read the source code of a multi-turn tool-use environment and write a strategy hint "
    "for an LLM agent, which calls tools as <tool_call>{json}</tool_call>, reads each result, "
    "and submits <answer>...</answer> only when every instruction is done; your hint is "
    "appended to its first observation. Describe the phases in terms of tool ROLES (look "
    "up, then update, then ...), which output feeds which call, which tools are distractors, "
    "and remind it to discover the arguments with the tools, to ask when an argument is "
    "missing and to decline what the tools cannot do. 2-3 sentences (under 100 words), "
    "value-free: no concrete ids, names, paths, amounts or dates from the code -- use "
    "placeholders like <order_id> -- and no filled-in call sequence. Output only the hint text."
)


def hint_system(setting: str) -> str:
    """The hint writer's system prompt for the setting (as the reference: one per setting)."""
    return TOOL_USE_HINT_SYSTEM if setting == "tool_use" else HINT_SYSTEM


def hint_prompt(code: str) -> str:
    return f"Environment code:\n```python\n{code}\n```"


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
