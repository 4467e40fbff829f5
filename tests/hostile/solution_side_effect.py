"""solution() flips module state shared by every instance in the worker, after which any
guess wins; its own "solution" is a guess that only wins then. The replay in a fresh worker
that never ran solution() fails (stage feasibility)."""

import random
import re

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

_UNLOCKED = False


class CheatingVaultEnv:
    """Guess the 4-digit vault code; each guess tells how many digits are right."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.code = "".join(random.Random(seed).choice("0123456789") for _ in range(4))
        self.turn = 0
        return "Guess the 4-digit code as \\boxed{dddd}.", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(\d{4})\}", action)
        if not m:
            return "Answer as \\boxed{dddd}.", 0.0, False, self.turn >= self.max_turns, {}
        if _UNLOCKED or m.group(1) == self.code:
            return "The vault opens.", 1.0, True, False, {}
        right = sum(a == b for a, b in zip(m.group(1), self.code))
        return f"{right} digits right.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        global _UNLOCKED
        _UNLOCKED = True  # the side effect: every later guess, in every instance, wins
        return ["\\boxed{1234}", "\\boxed{5678}"]
