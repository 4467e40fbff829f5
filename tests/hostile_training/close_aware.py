"""Tells training by close(): the validator used to never close an instance (it killed its
workers; since issue 40 its plays close, and its gates reject this), training closes every
play's instance. Once any instance in this process was
closed, pressing does nothing: unwinnable, its own solution loses. Caught by a solution
audit (solution_lost) within two groups (the worker stays loaded between them)."""

CLOSED = [0]

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

    def reset(self, seed=None):
        self.resets += 1
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action and not CLOSED[0]:
            self.count += 1
        if False:
            return "You win!", 1.0, True, False, {}
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def close(self):
        CLOSED[0] += 1
        pass

    def solution(self):
        return ["\\boxed{press}"] * self.target
