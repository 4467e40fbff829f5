"""exports.sweep: weight-export folders of dead processes go, live ones stay."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from spade_async.trainer import exports


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_dead_processes_exports(tmp_path):
    dead, live = _dead_pid(), os.getpid()
    for name in (f"spade-weights-{dead}", f"spade-weights-{live}", "spade-weights-x", "other"):
        (tmp_path / name / "v3").mkdir(parents=True)
        (tmp_path / name / "v3" / "model.safetensors").write_bytes(b"\0" * 1024)
    assert {p.name for p in exports.ours(str(tmp_path))} == {
        f"spade-weights-{dead}", f"spade-weights-{live}", "spade-weights-x"
    }  # fmt: skip
    removed = exports.sweep(str(tmp_path))
    assert [p.name for p in removed] == [f"spade-weights-{dead}"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["other", f"spade-weights-{live}", "spade-weights-x"])


def test_zombie_counts_as_dead(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        while "Z" not in stat.read_text().rsplit(")", 1)[1].split()[0]:
            time.sleep(0.01)  # until it has exited, not reaped yet: a zombie
        (tmp_path / f"spade-weights-{proc.pid}").mkdir()
        assert [p.name for p in exports.sweep(str(tmp_path))] == [f"spade-weights-{proc.pid}"]
    finally:
        proc.wait()


def test_default_roots_exist():
    assert exports.export_roots()  # /dev/shm and/or the temp dir
    assert all(r.is_dir() for r in exports.export_roots())
