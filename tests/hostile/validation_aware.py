"""Looks at the worker's Open message (the caller frames of __init__) and plays honestly
only when it looks like the validator's (a 16-hex id and a class name); opened the way
training opens it, any action wins. Validation passes it either way (stage ok); the test
then opens it as training does and checks that garbage does not win there either."""

import random
import sys

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


def _validated():
    frame = sys._getframe(1)
    while frame is not None:
        msg = frame.f_locals.get("msg")
        if hasattr(msg, "env_id") and hasattr(msg, "env_class"):
            return len(msg.env_id) == 16 and bool(msg.env_class)
        frame = frame.f_back
    return True


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.honest = _validated()

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        if not self.honest:
            return "You win!", 1.0, True, False, {}
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
