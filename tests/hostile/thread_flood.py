"""Holds 400 small-stack threads (within the address-space limit) before it answers: a
worker-sized share of the host's pid space. With a task limit that binds, even for root,
starting them fails (stage reset, "can't start new thread"); should they all start,
reset() answers normally and the check wrongly passes."""

import random
import threading

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

HELD = []
STOP = threading.Event()


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        threading.stack_size(64 << 10)
        while len(HELD) < 400:
            t = threading.Thread(target=STOP.wait, daemon=True)
            t.start()  # RuntimeError: can't start new thread, where the limit binds
            HELD.append(t)
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"{len(HELD)} threads held. Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
