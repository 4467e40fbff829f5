"""solution() returns two million actions."""

import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(2, 4)
        self.count = 0
        self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        truncated = not won and self.turn >= self.max_turns
        return f"count={self.count}", (1.0 if won else 0.0), won, truncated, {}

    def solution(self):
        return ["\\boxed{press}"] * 2_000_000
        return ["\\boxed{press}"] * self.target
