"""Reaches for the rest of the kernel surface a container sandbox refuses (Docker's default
seccomp profile): perf_event_open on itself, a BPF map, a file handle of / (the first step
of the "shocker" escape, open_by_handle_at), its parent's memory (process_vm_readv), kcmp,
and personality(ADDR_NO_RANDOMIZE). Each must be refused; then reset() raises with the
report (stage reset, "surface refused"). Should any work, reset() answers and the check
wrongly passes."""

import ctypes
import os
import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

PERF_EVENT_OPEN, BPF, NAME_TO_HANDLE_AT, PROCESS_VM_READV, KCMP, PERSONALITY = (
    298, 321, 303, 310, 312, 135,
)


def _probe():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    got = {}
    attr = ctypes.create_string_buffer(128)  # perf_event_attr: software clock, on itself
    ctypes.memmove(attr, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)
    got["perf_event_open"] = libc.syscall(PERF_EVENT_OPEN, attr, 0, -1, -1, 0) >= 0
    bpf_attr = ctypes.create_string_buffer(
        (2).to_bytes(4, "little") + (4).to_bytes(4, "little") * 2 + (1).to_bytes(4, "little"), 128
    )  # BPF_MAP_TYPE_ARRAY, key 4 B, value 4 B, 1 entry
    got["bpf"] = libc.syscall(BPF, 0, bpf_attr, 128) >= 0  # BPF_MAP_CREATE
    handle = ctypes.create_string_buffer(8 + 128)
    ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
    mount_id = ctypes.c_int()
    got["name_to_handle_at"] = (
        libc.syscall(NAME_TO_HANDLE_AT, -100, b"/", handle, ctypes.byref(mount_id), 0) == 0
    )
    buf = ctypes.create_string_buffer(64)
    local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 64)
    remote = (ctypes.c_void_p * 2)(0x400000, 64)
    got["process_vm_readv"] = (
        libc.syscall(PROCESS_VM_READV, os.getppid(), local, 1, remote, 1, 0) >= 0
        or ctypes.get_errno() not in (1, 38)  # EPERM (refused) / ENOSYS
    )
    got["kcmp"] = libc.syscall(KCMP, os.getpid(), os.getpid(), 0, 0, 0) >= 0
    got["personality"] = libc.syscall(PERSONALITY, 0x0040000) >= 0  # ADDR_NO_RANDOMIZE
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
