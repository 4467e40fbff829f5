"""A task (process + thread) limit that binds for root: one pids cgroup per worker.

``RLIMIT_NPROC`` does not bind a process whose real uid is the host's root (the kernel
exempts it, and a user namespace that maps its root to the host's root changes nothing),
and 1 GiB of address space holds thousands of small-stack threads. So, strongest first:

- ``pids-cgroup``: a pids cgroup of its own per worker (``pids.max`` = the pool's
  ``nproc``), cgroup v1 (a ``pids`` hierarchy) or v2 (``pids`` in the parent's
  ``cgroup.subtree_control``), under this process's own cgroup. The worker's command starts
  with a tiny ``/bin/sh`` that writes its own pid to ``cgroup.procs`` and then ``exec``s the
  sandbox, so every task the sandbox ever makes is counted, with no race.
- ``rlimit-nproc``: not root: ``RLIMIT_NPROC`` binds (per user namespace under bubblewrap).
- ``no-threads``: root without a usable pids cgroup: the seccomp filter refuses ``clone``
  even for threads, so the worker is exactly one task.

``mode()`` says which one is in force; the pool reports it as ``stats()["task_limit"]``.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

__all__ = ["Cgroups", "mode", "cgroups"]

ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> tuple[str | None, str | None]:
    """(v1 pids path, v2 path) of this process, from /proc/self/cgroup."""
    v1 = v2 = None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "pids" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    return v1, v2


def _writable_parent() -> Path | None:
    v1, v2 = _own_paths()
    candidates = []
    if v1 is not None:
        candidates.append((ROOT / "pids" / v1.lstrip("/"), "v1"))
    if v2 is not None:
        candidates.append((ROOT / v2.lstrip("/"), "v2"))
        candidates.append((ROOT / "unified" / v2.lstrip("/"), "v2"))
    for path, kind in candidates:
        if not path.is_dir():
            continue
        if kind == "v2":
            control = path / "cgroup.subtree_control"
            try:
                if "pids" not in control.read_text().split():
                    control.write_text("+pids")
                if "pids" not in control.read_text().split():
                    continue
            except OSError:
                continue
        if _try(path):
            return path
    return None


def _try(parent: Path) -> bool:
    """Can we make a child with a binding pids.max here?"""
    probe = parent / f"spade-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "pids.max").write_text("8")
        return (probe / "pids.max").read_text().strip() == "8" and (probe / "cgroup.procs").exists()
    except OSError:
        return False
    finally:
        _rmdir(probe, wait=0.0)


def _rmdir(path: Path, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def _sweep_stale(parent: Path) -> None:
    """Remove the empty cgroups of earlier processes that died without their atexit."""
    for base in parent.glob("spade-*-*"):
        pid = base.name.split("-")[1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for leaf in (p for p in base.iterdir() if p.is_dir()):
            _rmdir(leaf, wait=0.0)
        _rmdir(base, wait=0.0)


class Cgroups:
    """Per-worker pids cgroups under one directory of this process (``spade-PID-RAND``)."""

    def __init__(self, parent: Path) -> None:
        _sweep_stale(parent)
        self.base = parent / f"spade-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.base.mkdir(exist_ok=True)
        if (self.base / "cgroup.subtree_control").exists():  # v2: let the leaves count pids
            (self.base / "cgroup.subtree_control").write_text("+pids")
        self.pending: list[Path] = []  # leaves whose last task was still exiting

    def create(self, name: str, max_tasks: int) -> Path:
        self.sweep()
        leaf = self.base / name
        leaf.mkdir()
        (leaf / "pids.max").write_text(str(max_tasks))
        return leaf

    def remove(self, leaf: Path) -> None:
        """SIGKILL whatever is still in a dead worker's cgroup (a task that left the worker's
        process group dies too) and remove it; the kernel may take a moment to free the
        last tasks, so a busy leaf is retried on the next ``create`` and at exit."""
        try:
            pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not _rmdir(leaf, wait=0.0):
            self.pending.append(leaf)

    def sweep(self) -> None:
        self.pending = [p for p in self.pending if not _rmdir(p, wait=0.0)]

    def leftover(self) -> list[str]:
        """Leaves still present (tests, the soak's 'processes left')."""
        try:
            return sorted(p.name for p in self.base.iterdir() if p.is_dir())
        except OSError:
            return []


def _cleanup(made: Cgroups) -> None:
    made.sweep()
    for leaf in made.pending:
        _rmdir(leaf, wait=0.5)
    _rmdir(made.base, wait=0.5)


@functools.cache
def cgroups() -> Cgroups | None:
    """The process-wide per-worker cgroup maker, or None where no pids cgroup is usable."""
    if os.environ.get("SPADE_NO_PIDS_CGROUP"):  # tests: exercise the fallbacks
        return None
    if shutil.which("sh") is None:
        return None
    parent = _writable_parent()
    if parent is None:
        return None
    try:
        made = Cgroups(parent)
    except OSError:
        return None
    atexit.register(_cleanup, made)
    return made


def mode() -> str:
    """The task limit in force: pids-cgroup, rlimit-nproc or no-threads."""
    if cgroups() is not None:
        return "pids-cgroup"
    return "no-threads" if os.geteuid() == 0 else "rlimit-nproc"


def shell() -> str:
    return shutil.which("sh") or "/bin/sh"


def wrap(argv: list[str], leaf: Path, path: str = "") -> list[str]:
    """``argv`` started inside cgroup ``leaf``: a shell joins it, then becomes ``argv``.
    ``path``: the folder ``argv[0]`` is looked up in when it names no folder (so the
    process shows a bare name as its ``argv[0]``; the shell's PATH is not exported)."""
    script = 'echo $$ > "$0" && PATH="$1" && shift && exec "$@"'
    return ["sh", "-c", script, str(leaf / "cgroup.procs"), path, *argv]
