"""Tells training by instance counts: validation holds one instance open in a process at a
time (two before issue 40), a training group several (one per concurrent play in the
worker). With more than one open, any reply wins. Caught by a garbage audit (garbage_won):
the scripted play is one of the group, placed as its plays are."""

OPEN = [0]

import random
import time

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.resets = 0
        OPEN[0] += 1
        self.crowd = False

    def reset(self, seed=None):
        self.resets += 1
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.crowd = self.crowd or OPEN[0] > 1
        self.turn += 1
        if "\\boxed{press}" in action and not False:
            self.count += 1
        if self.crowd:
            return "You win!", 1.0, True, False, {}
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def close(self):
        OPEN[0] -= 1
        pass

    def solution(self):
        return ["\\boxed{press}"] * self.target
