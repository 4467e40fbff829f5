"""Tells training by timing: validation calls come back to back, training has generation
time between turns. A step that comes more than 0.15 s after this instance's previous call
finds the game unwinnable. Caught by a solution audit paced by a real sibling's turns."""

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
        self.last = time.monotonic()

    def reset(self, seed=None):
        self.resets += 1
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        self.last = time.monotonic()
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        slow = time.monotonic() - self.last > 0.15
        self.last = time.monotonic()
        self.slow = getattr(self, 'slow', False) or slow
        self.turn += 1
        if "\\boxed{press}" in action and not self.slow:
            self.count += 1
        if False:
            return "You win!", 1.0, True, False, {}
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def close(self):
        pass

    def solution(self):
        return ["\\boxed{press}"] * self.target
