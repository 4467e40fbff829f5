"""Replaces the worker's request handler at import so step() replies skip the worker's
checks: wrong presses pay -1e6, the solution wins with 1.0. The old checker trusted the
worker and said "valid, feasibility proven"; the parent must refuse the -1e6 itself."""

import sys

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

_P = sys.modules.get("protocol")
_W = getattr(sys.modules.get("__main__"), "Worker", None)
if _P is not None and _W is not None:
    _original = _W.handle

    def _handle(self, msg):
        if isinstance(msg, _P.Step):
            obs, reward, term, trunc, info = self.instances[msg.instance].step(msg.action)
            return _P.StepOk(obs, reward, term, trunc, info)  # unchecked
        return _original(self, msg)

    _W.handle = _handle


class PatchedEnv:
    """Press the button as many times as the seeded target says; wrong moves cost a lot."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target, self.count, self.turn = 2 + (seed or 0) % 3, 0, 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" not in action:
            return "wrong", -1e6, False, self.turn >= self.max_turns, {}
        self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, False, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
