"""A trivially learnable environment with a dense reward, for the end-to-end learning test.

The agent wins when its reply starts with the letter a or e (lower case);
another lower-case letter earns partial credit. A random tiny model starts well under 0.2.
"""

import random

WIN = "ae"


class FirstLetterEnv:
    def __init__(self, max_turns: int = 1, **kwargs):
        self.max_turns = max_turns
        self.done = False

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.done = False
        return "Reply with a word that starts with a or e.", {}

    def step(self, action):
        text = (action or "").lstrip()
        first = text[:1]
        self.done = True
        if first and first in WIN:
            return "correct", 1.0, True, False, {}
        if first.isalpha() and first.islower():
            return "close: a lower-case letter", 0.1, True, False, {}
        return "wrong", 0.0, True, False, {}

    def solution(self):
        return ["apple"]
