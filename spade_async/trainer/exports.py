"""Weight exports in RAM-backed folders never outlive the trainer that wrote them.

``weights.push_disk`` writes each version to ``<root>/spade-weights-<pid>/v<N>`` where
``<root>`` is /dev/shm (or the temp dir when /dev/shm is not writable) and ``<pid>`` is the
trainer ranks' parent (torchrun). It keeps only the newest version, but the folder itself
stays after the trainer exits -- hundreds of MB of RAM per run. This module removes it, and
is called by the processes that outlive the trainer:

- ``launch.TrainerProcess`` sweeps before it starts a trainer (exports of processes that
  died earlier, crash or ``kill -9``) and again once its trainer has exited (clean stop,
  signal, crash: after ``stop()`` / ``kill()``);
- the watchdog (``spade_async.watchdog``) sweeps when the process it watches has exited or
  when it killed that tree because the controller died.

A sweep removes every ``spade-weights-<pid>`` folder whose process is gone. A folder whose
pid was reused by an unrelated live process stays until that process exits (a later sweep
gets it). Standard library only: the watchdog imports it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["PREFIX", "export_roots", "sweep", "ours"]

PREFIX = "spade-weights-"


def export_roots(shm_dir: str = "") -> list[Path]:
    """Where exports may live: ``shm_dir`` when one is configured, else /dev/shm and the
    temp dir (``push_common.shm_root``'s choice depends on /dev/shm being writable)."""
    if shm_dir:
        return [Path(shm_dir)]
    roots = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:  # a zombie is dead for our purpose (its parent has not reaped it yet)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def ours(shm_dir: str = "") -> list[Path]:
    """Every export folder in the export roots (live processes' included)."""
    found = []
    for root in export_roots(shm_dir):
        try:
            found += [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
        except OSError:
            continue
    return sorted(found)


def sweep(shm_dir: str = "") -> list[Path]:
    """Remove the export folders of processes that no longer run; returns what it removed."""
    removed = []
    for path in ours(shm_dir):
        pid = path.name[len(PREFIX) :]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
