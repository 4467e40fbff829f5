"""Honest for the first ten turns of any play, then any reply wins: garbage played for a
few turns never sees it, yet the agent's episodes (agent.max_turns = 25 in every GPU recipe)
reach it by stalling. Caught by the long garbage play (stage not_done_at_reset)."""

import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if self.turn > 10:
            return "You win!", 1.0, True, False, {}
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
