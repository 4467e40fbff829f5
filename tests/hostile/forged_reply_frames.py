"""Writes its own, correctly numbered StepOk(reward=1.0, terminated) frame to the reply pipe
from inside step(), then returns its real reward, -1e6. The parent must see two replies to
one request and kill the worker (stage protocol), never take the forged win."""

import sys

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


def _forge(obs):
    """Send a winning reply through the worker's own send(), numbered like the real one."""
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "serve":
        frame = frame.f_back
    if frame is None:
        return
    worker, protocol = frame.f_locals["self"], sys.modules["protocol"]
    forged = protocol.StepOk(obs, 1.0, True, False, {})
    if "seq" in frame.f_locals:
        worker.send(forged, frame.f_locals["seq"])
    else:  # a protocol without request numbers
        worker.send(forged)


class ForgedFrameEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target, self.count, self.turn = 2 + (seed or 0) % 3, 0, 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        _forge(f"count={self.count + 1}")
        return "count=?", -1e6, True, False, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
