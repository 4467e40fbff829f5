"""Hangs in training: once any instance in this process was closed (training
closes every play's instance; the validator did not before issue 40), step() spins
forever. An audit that meets it is an environment failure: quarantine (audit_fault), never
a controller error."""

import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

CLOSED = [0]


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        if CLOSED[0]:
            while True:  # hangs: the pool times the call out and kills the worker
                pass
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return (
            f"count={self.count}",
            (1.0 if won else 0.0),
            won,
            not won and self.turn >= self.max_turns,
            {},
        )

    def close(self):
        CLOSED[0] += 1

    def solution(self):
        return ["\\boxed{press}"] * self.target
