"""The letter-window family: the designer picks one letter, the family builds the game.

The game: a window of ``WIDTH`` consecutive letters (wrapping z -> a) is hidden at a random
place (from the seed); the agent has ``ATTEMPTS`` replies, each scored by its first
character, and wins (reward 1) when one names a lowercase letter inside the window. The
designer's letter sets the width: ``a`` = 26 (every letter wins), ``b`` = 25, ... ``z`` = 1.

Why this family shows the designer learning on a CPU in minutes: the model of ``spade demo
--learning`` is a random-initialised tiny Llama over a character vocabulary (``char_model``;
101 ids, 26 of them lowercase letters), so at first a reply starts with a lowercase letter
about one time in four: a 26-wide window (``a``) is won in about 60% of plays, narrow ones
(late letters) almost never, and about three replies in four name no letter at all (no
parameter: reward 0). The designer's reward is low until its replies become letters near
the agent's frontier (a game won about half the time, where the blend reward pays most);
that is a shift of one token's distribution, which a few trainer steps can make. As the
agent's replies change (its letters and the designer's come from one model), the frontier
moves and the designer has to follow it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from spade_async.settings.base import Family

ATTEMPTS = 3
_LETTER = re.compile(r'^LETTER = "([a-z])"$', re.MULTILINE)

TEMPLATE = '''\
"""Letter window of width {width} (the designer's letter: {letter!r})."""

import random
import re

LETTER = "{letter}"
WIDTH = {width}
ATTEMPTS = {attempts}
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_BOXED = re.compile(r"^\\\\boxed\\{{\\s*([a-z])\\s*\\}}")


class LetterWindowEnv:
    def __init__(self, max_turns: int = ATTEMPTS, **kwargs):
        self.max_turns = ATTEMPTS
        self.start = 0
        self.turns = 0

    def reset(self, seed=None):
        self.start = random.Random(seed).randrange(26)
        self.turns = 0
        return (
            f"Hidden: {{WIDTH}} consecutive letters (z wraps to a). Name one lowercase letter "
            f"inside them. {{ATTEMPTS}} attempts."
        ), {{}}

    def _inside(self, letter):
        return (ALPHABET.index(letter) - self.start) % 26 < WIDTH

    def step(self, action):
        self.turns += 1
        text = str(action or "").lstrip()
        boxed = _BOXED.match(text)
        letter = boxed.group(1) if boxed else text[:1]
        if letter and letter in ALPHABET and self._inside(letter):
            return f"{{letter}} is inside the window: you win.", 1.0, True, False, {{}}
        if self.turns >= ATTEMPTS:
            return "No attempts left.", 0.0, False, True, {{}}
        left = ATTEMPTS - self.turns
        return f"Not inside the window. Attempts left: {{left}}.", 0.0, False, False, {{}}

    def solution(self):
        return ["\\\\boxed{{" + ALPHABET[self.start] + "}}"]
'''


def width(letter: str) -> int:
    """The window width the letter asks for: a -> 26 ... z -> 1."""
    return 26 - string.ascii_lowercase.index(letter)


def build(reply: str) -> str | None:
    """The environment for the designer's reply: its first non-space character must be a
    lowercase letter (the format the prompt asks for); anything else has no parameter."""
    first = (reply or "").lstrip()[:1]
    if not first or first not in string.ascii_lowercase:
        return None
    return TEMPLATE.format(letter=first, width=width(first), attempts=ATTEMPTS)


def letter_of(code: str) -> str | None:
    """The letter an environment of this family was built from (None for other files)."""
    m = _LETTER.search(code)
    return m.group(1) if m else None


def prompt(
    *,
    skill: str,
    positives: Sequence[tuple[str, float | None, float | None]] = (),
    negative: tuple[str, str] | None = None,
    **_: object,
) -> str:
    """The designer's prompt; memory examples appear as the letters they were built from."""
    lines = [
        f"You design training environments for a reasoning agent (skill: {skill}). Family: "
        f"letter window. A window of consecutive letters is hidden; the agent has {ATTEMPTS} "
        "attempts to name a letter inside it. You choose the window's width with one letter: "
        "a = 26 letters wide (always won), b = 25, ..., z = 1 letter wide (hardest). Choose "
        "the width at the agent's frontier: a game it wins about half of the time."
    ]
    for code, rate, regret in positives:
        letter = letter_of(code)
        if letter and rate is not None:
            lines.append(
                f"Letter {letter} worked: the agent won {rate:.0%} (regret {regret or 0:.2f})."
            )
    if negative and letter_of(negative[0]):
        lines.append(f"Letter {letter_of(negative[0])} did not work ({negative[1]}).")
    lines.append("Reply with the letter only.")
    return "\n".join(lines)


FAMILY = Family(
    name="letter_window",
    prompt=prompt,
    build=build,
    no_parameter="the reply does not start with a lowercase letter (the window's width)",
)
