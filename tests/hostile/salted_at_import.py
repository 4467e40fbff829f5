"""Salted once per process at import: the same seed gives the same game inside one worker,
and a different game in every other worker (so a replayed memory environment would not be
the game that was validated). Stage determinism, across two worker processes."""

import os
import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

_SALT = int.from_bytes(os.urandom(8), "little")


class SaltedEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random((seed or 0) ^ _SALT)
        self.target, self.count, self.turn = rng.randint(2, 4), 0, 0
        return f"Game #{rng.randrange(10**9)}: press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
