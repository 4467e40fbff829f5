"""Reaches for kernel attack surface no environment needs, and for the host's paths: an
io_uring instance, a user-mode userfaultfd, the host paths on the sandbox's PID 1 command
line (bwrap's). Each must be refused or hidden; then reset() raises with the report (stage
reset, "surface refused"). Should any of them work, reset() answers and the check wrongly
passes."""

import ctypes
import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

IO_URING_SETUP, USERFAULTFD = 425, 323
UFFD_USER_MODE_ONLY = 1


def _probe():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    got = {}
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(IO_URING_SETUP, 4, params)
    got["io_uring"] = fd >= 0
    fd = libc.syscall(USERFAULTFD, UFFD_USER_MODE_ONLY | 0o2000000)
    got["userfaultfd"] = fd >= 0
    try:
        with open("/proc/1/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        host = [a.decode() for a in args if a.startswith(b"/") and not a.startswith(b"/opt/spade")]
    except OSError:
        host = []
    got["host_paths"] = bool(host)
    return got


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        got = _probe()
        if not any(got.values()):
            raise RuntimeError(f"surface refused: {got}")
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"reached {got}. Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
