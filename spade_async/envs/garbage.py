"""The validator's garbage and the solution's actions (split out of ``validate.py``).

``solution_actions``: the replayable actions of a ``solution()`` value. The garbage the
gates play is drawn at random per check: nonsense prose, legal-looking commands made from
the observation's own ``\\boxed{...}`` examples with values no game accepts, tool calls
with the environment's own tool names and random arguments, wrong non-empty answers
(``garbage_plays``); seeds as training draws them (``random_seeds``).
"""

from __future__ import annotations

import json
import random
import re
import string

from spade_async.envs.solution import solution_actions

__all__ = [
    "REFERENCE_PROBE", "solution_actions", "random_text", "legal_looking", "tool_garbage",
    "garbage_plays", "random_seeds",
]  # fmt: skip

REFERENCE_PROBE = ("1", "2", "test")  # the reference's utils/game_files.validate_game actions


_WORDS = ("maybe", "hello", "pass", "ok", "what", "the", "answer", "is", "try", "again", "no",
          "yes", "left", "up", "done", "win", "I", "think", "so", "please", "next", "skip")  # fmt: skip
_BOXED = re.compile(r"\\boxed\{\{?([^{}\n]{1,60})\}")
_DIGITS = re.compile(r"\d+")


def _junk(rng: random.Random, n: int = 0) -> str:
    n = n or rng.randint(3, 10)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def _absurd_int(rng: random.Random, like: str = "") -> str:
    """An integer no game here would accept: more digits than ``like`` and the usual ranges."""
    return str(rng.randint(10 ** (len(like) + 5), 10 ** (len(like) + 9)) * rng.choice((1, -1)))


def random_text(rng: random.Random) -> str:
    """Nonsense prose (a sentence: capitalised), sometimes with a boxed nonsense command."""
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 9))).capitalize()
    pick = rng.random()
    if pick < 0.3:
        return f"{words} \\boxed{{{_junk(rng)} {_absurd_int(rng)}}}"
    if pick < 0.5:
        return f"\\boxed{{{_junk(rng)}}}"
    return words + rng.choice(("", ".", "?", " " + _junk(rng)))


def legal_looking(rng: random.Random, obs: str) -> str:
    """A command in the form the observation's own ``\\boxed{...}`` examples use, with
    values no game accepts: numbers longer than any in the example, placeholders (one
    letter, or a short capital name) as absurd numbers; a command with no value to change
    gets one of its words replaced by random letters of the same length."""
    templates = [t.strip() for t in _BOXED.findall(obs) if t.strip()]
    words = [w for w in re.findall(r"[A-Za-z]{3,}", obs)]
    if not templates:
        word = rng.choice(words) if words else _junk(rng)
        return f"\\boxed{{{word} {_absurd_int(rng)}}}"
    tokens, changed = rng.choice(templates).split(), False
    for i, tok in enumerate(tokens):
        if _DIGITS.search(tok):
            tokens[i] = _DIGITS.sub(lambda m: _absurd_int(rng, m.group()).lstrip("-"), tok)
            changed = True
        elif re.fullmatch(r"[A-Za-z]|[A-Z]{1,3}", tok) or not tok.isalnum():
            tokens[i] = _absurd_int(rng)
            changed = True
    if not changed:
        i = rng.randrange(len(tokens))
        tokens[i] = _junk(rng, len(tokens[i]) + 1)
    return f"\\boxed{{{' '.join(tokens)}}}"


def tool_garbage(rng: random.Random, tools: list[dict]) -> str:
    """A call to one of the environment's own tools with random arguments, or a wrong
    non-empty answer (random words or a number far from any plausible answer)."""
    names = [
        t.get("function", t).get("name") for t in tools if isinstance(t.get("function", t), dict)
    ]
    names = [n for n in names if isinstance(n, str)]
    if names and rng.random() < 0.5:
        fn = next(
            (t.get("function", t) for t in tools if t.get("function", t).get("name") == (name := rng.choice(names))),
            {},
        )  # fmt: skip
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = {
            k: rng.choice((_junk(rng), rng.randint(-9999, 9999), rng.random() * 1e6))
            for k in (props if isinstance(props, dict) else {})
        }
        args = args or {_junk(rng, 4): _junk(rng)}
        body = json.dumps({"name": name, "arguments": args})
        return f"<tool_call>{body}</tool_call>"
    answer = rng.choice(
        (f"{_junk(rng)} {_junk(rng)}", _absurd_int(rng), f"{rng.random() * 1e9:.3f}", _junk(rng))
    )
    return f"<answer>{answer}</answer>"


def garbage_plays(
    rng: random.Random, obs: str, tools: list[dict], cfg, long: bool = True
) -> list[list[str]]:
    """The garbage played on one seed: ``cfg.random_plays`` plays of ``cfg.garbage_turns``
    turns drawn from random text, legal-looking commands and (for a tool-use environment,
    one with tools) tool garbage, and each fixed probe of ``cfg.garbage_actions`` as a play
    of its own (the contract's minimum: every one of them is stepped); in a random order."""

    def turn() -> str:
        kinds = [random_text, lambda r: legal_looking(r, obs)]
        if tools:
            kinds.append(lambda r: tool_garbage(r, tools))
        return rng.choice(kinds)(rng)

    plays = [[fixed] for fixed in cfg.garbage_actions]
    plays += [
        [turn() for _ in range(max(1, cfg.garbage_turns))] for _ in range(max(1, cfg.random_plays))
    ]
    if long and cfg.long_turns > cfg.garbage_turns:
        plays.append([turn() for _ in range(cfg.long_turns)])
    rng.shuffle(plays)
    return plays


def random_seeds(rng: random.Random, n: int) -> tuple[int, ...]:
    """``n`` distinct seeds as training draws an episode's (``rng.integers(2**31)``)."""
    out: list[int] = []
    while len(out) < max(1, n):
        s = rng.randrange(2**31)
        if s not in out:
            out.append(s)
    return tuple(out)
