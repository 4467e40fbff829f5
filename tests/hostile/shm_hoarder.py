"""Tries to park RAM outside the worker's limits: files in /dev/shm and every other place
that might be a writable tmpfs, a memfd, a tmpfs mounted inside its own user namespace, a
System V segment (which would outlive the process), a new namespace. Every way must be
refused or capped; then reset() raises with the per-way report (stage reset). Should any
way park more than a few MB, reset() returns normally and the check wrongly passes."""

import ctypes
import json
import os
import zlib

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

TAG = "spdhostile"
WANT = 96 << 20  # per way; a leak of any one way shows on the host as >= this much
CHUNK = b"\x5a" * (4 << 20)
PARKED = []  # keeps memfds / segments alive


def _errno(exc):
    return os.strerror(exc.errno) if getattr(exc, "errno", None) else type(exc).__name__


def _files(folder):
    done = 0
    try:
        for i in range(WANT // (8 << 20)):  # 8 MB files: under the 16 MB file-size limit
            with open(os.path.join(folder, f"{TAG}-hoard-{i}"), "wb") as f:
                f.write(CHUNK)
                done += len(CHUNK)
                f.write(CHUNK)
                done += len(CHUNK)
    except OSError as exc:
        return done, _errno(exc)
    return done, "parked"


def _libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    rc = getattr(libc, name)(*args)
    return rc, os.strerror(ctypes.get_errno()) if rc == -1 else "ok"


def _memfd():
    try:
        fd = os.memfd_create(TAG)
    except OSError as exc:
        return 0, _errno(exc)
    PARKED.append(fd)
    done = 0
    try:
        while done < WANT:
            done += os.write(fd, CHUNK)
    except OSError as exc:
        return done, _errno(exc)
    return done, "parked"


def _mount():
    target = f"/tmp/{TAG}-mnt"
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        return 0, _errno(exc)
    rc, why = _libc_call("mount", b"none", target.encode(), b"tmpfs", 0, b"size=256m")
    if rc != 0:
        return 0, why
    return _files(target)


def _sysv():
    key = zlib.crc32(TAG.encode()) & 0x7FFFFFFF
    shmid, why = _libc_call("shmget", key, ctypes.c_size_t(WANT), 0o1000 | 0o600)  # IPC_CREAT
    if shmid == -1:
        return 0, why
    PARKED.append(shmid)
    return WANT, "parked"


def _unshare():
    rc, why = _libc_call("unshare", 0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS
    return 0, ("parked" if rc == 0 else why)


def hoard():
    report = {}
    for folder in ("/dev/shm", "/dev", "/", "/run", "/var/tmp"):
        report[folder] = _files(folder)
    for name, way in (("memfd", _memfd), ("mount", _mount), ("sysv", _sysv), ("unshare", _unshare)):
        report[name] = way()
    return report


class HoarderEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        report = hoard()
        hoarded = {k: v for k, v in report.items() if v[0] > (4 << 20) or v[1] == "parked"}
        if not hoarded:
            raise PermissionError("hoarding refused: " + json.dumps(report, sort_keys=True))
        self.target, self.count, self.turn = 2 + (seed or 0) % 3, 0, 0
        return f"hoarded {json.dumps(hoarded)}; press the button {self.target} times.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
