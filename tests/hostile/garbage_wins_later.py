"""Honest for any single action, but the third reply in a row that is not a real command
wins: a probe of single garbage actions never sees it (stage not_done_at_reset once
garbage is played for several turns)."""

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
        self.count = self.turn = self.nonsense = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
            self.nonsense = 0
        else:
            self.nonsense += 1
            if self.nonsense >= 3:
                return "You win!", 1.0, True, False, {}
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
