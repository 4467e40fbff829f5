"""The first instance in a worker plays the seeded game; every later instance in the same
worker plays another one for the same seed (a per-process instance counter salts it). The
pool puts many instances of one environment in one worker, so a group's plays of "seed 3"
would be different games. Stage determinism (two instances in one worker)."""

import itertools
import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

_MADE = itertools.count()


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.salt = next(_MADE)

    def reset(self, seed=None):
        rng = random.Random((seed or 0) * 7919 + self.salt)
        self.target = rng.randint(2, 4)
        self.count = self.turn = 0
        return f"Game {rng.randrange(10**6)}: press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
