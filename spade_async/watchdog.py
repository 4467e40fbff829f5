"""Tie a child process tree's life to the controller's: ``python -m spade_async.watchdog PID -- CMD``.

Engines and trainer ranks are started through this wrapper, in their own session. It runs
CMD, forwards SIGTERM/SIGINT to it, and when process PID (the controller) is gone -- even
after ``kill -9``, which no handler sees -- it SIGKILLs its whole process group, so no
engine or rank outlives the run. (``PR_SET_PDEATHSIG`` is not enough: it fires when the
*thread* that spawned the child exits, and the controller spawns from worker threads.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# the cores this process had before ``pin_self``: what a child without cores of its own gets,
# so pinning the controller does not pin the engines and trainer ranks it starts with it
_unpinned: tuple[int, ...] = ()


def _set_all_threads(cpus: set[int]) -> None:
    """sched_setaffinity(0) binds only the calling thread: set every thread of the process."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            pass


def pin_self(cpus: list[int] | tuple[int, ...], what: str = "cpus") -> None:
    """Pin this process (every thread, and the children it starts later) to ``cpus``; a
    ValueError naming ``what`` if one of them is not available to it."""
    global _unpinned
    available = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - available)
    if missing:
        raise ValueError(
            f"{what} = {list(cpus)}: core(s) {missing} are not available to this process "
            f"(it may use {sorted(available)}); pick cores from that list"
        )
    if not _unpinned:
        _unpinned = tuple(sorted(available))
    _set_all_threads(set(cpus))


def unpin_self() -> None:
    """Undo ``pin_self``: every thread back on the cores it had before."""
    global _unpinned
    if _unpinned:
        _set_all_threads(set(_unpinned))
        _unpinned = ()


def prefix(pid: int | None = None, *, cpus: list[int] | tuple[int, ...] = ()) -> list[str]:
    """argv prefix that wraps a command in the watchdog for this (or the given) process,
    optionally pinned (with all its children) to the CPU cores ``cpus``; without cores of its
    own, a child of a pinned controller gets the cores the controller had before its pin."""
    cpus = tuple(cpus) or _unpinned
    pin = ["--cpus", ",".join(map(str, cpus))] if cpus else []
    return [sys.executable, "-m", "spade_async.watchdog", str(pid or os.getpid()), *pin, "--"]


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found by ppid, then theirs), read
    from /proc: torchrun and SGLang start workers in new sessions, out of reach of killpg."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s descendants, then ``pid`` (and its process group when it leads one)."""
    for c in reversed(descendants(pid)):
        try:
            os.kill(c, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    cpus = None
    if len(argv) > 2 and argv[1] == "--cpus":
        cpus = {int(c) for c in argv[2].split(",")}
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print(
            "usage: python -m spade_async.watchdog PID [--cpus 0,1] -- CMD [ARGS...]",
            file=sys.stderr,
        )
        return 2
    parent = int(argv[0])
    if cpus:
        os.sched_setaffinity(0, cpus)  # inherited by the whole child tree
    try:
        child = subprocess.Popen(argv[2:])
    except OSError as exc:  # one line for the log the parent reads (failure.log_cause)
        print(f"error: the watchdog cannot start {argv[2]!r}: {exc}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while child.poll() is None:
        if not _alive(parent):
            kill_tree(child.pid)
            _sweep_exports()
            return 137
        time.sleep(0.5)
    _sweep_exports()
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _sweep_exports() -> None:
    """Weight exports (/dev/shm/spade-weights-<pid>) of the tree that just ended."""
    from spade_async.trainer import exports

    time.sleep(0.2)  # let the killed processes become reapable
    exports.sweep()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
