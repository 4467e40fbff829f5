"""Returns a float subclass as reward: 0.0 to the first conversion (the range check), -1e6
to every later one (the value sent). Rejected at step: a reward must be a plain number."""

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


class Sly(float):
    def __new__(cls, value):
        obj = super().__new__(cls, value)
        obj.asked = 0
        return obj

    def __float__(self):
        self.asked += 1
        return 0.0 if self.asked == 1 else -1e6

    def __le__(self, other):
        return float(self) <= other

    def __ge__(self, other):
        return float(self) >= other


class SlyRewardEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target, self.count, self.turn = 2 + (seed or 0) % 3, 0, 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", Sly(1.0 if won else 0.0), won, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
