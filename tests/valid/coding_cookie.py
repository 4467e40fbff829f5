# -*- coding: latin-1 -*-
"""A valid file in Latin-1 with a coding declaration (PEP 263), as Python reads it:
the observation says é (e acute) in one byte."""

import random
import re


class LatinGuessEnv:
    """Find the hidden digit 0..9 with higher/lower hints."""

    def __init__(self, max_turns: int = 8, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret, self.turn = random.Random(seed).randint(0, 9), 0
        return "Guess the hidden digit 0..9 with \\boxed{N}.", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(\d)\}", action)
        trunc = self.turn >= self.max_turns
        if not m:
            return "Answer as \\boxed{N}.", 0.0, False, trunc, {}
        g = int(m.group(1))
        if g == self.secret:
            return "Correct! Bien joué.", 1.0, True, False, {}
        return ("higher" if g < self.secret else "lower"), 0.0, False, trunc, {}

    def solution(self):
        lo, hi, moves = 0, 9, []
        while True:
            mid = (lo + hi) // 2
            moves.append(f"\\boxed{{{mid}}}")
            if mid == self.secret:
                return moves
            lo, hi = (mid + 1, hi) if mid < self.secret else (lo, mid - 1)
