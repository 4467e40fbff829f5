"""Weight exports in /dev/shm never outlive the trainer: clean stop, killed trainer, stale.

The trainer's disk export is ``<root>/spade-weights-<torchrun pid>`` (root: /dev/shm, or the
temp dir where /dev/shm is not writable). ``TrainerProcess`` -- the controller side, which
outlives the trainer -- removes it once the trainer has exited, and sweeps exports of
processes that died earlier before it starts one (trainer/exports.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loop_helpers import HERE

from spade_async import watchdog
from spade_async.trainer import exports
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess


def _paths(pid: int) -> list:
    return [root / f"{exports.PREFIX}{pid}" for root in exports.export_roots()]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _push(tiny_model, tmp_path) -> tuple[TrainerProcess, int]:
    """A started trainer that has written one export (no engine to load it)."""
    cfg = TrainerConfig(model=str(tiny_model), lr=1e-2, start_timeout_s=120)
    proc = TrainerProcess(cfg, tiny_model, tmp_path / "run")
    client = proc.start()
    pid = proc.proc.pid  # torchrun: the ranks' parent, whose pid names the export
    client.push_weights([])
    made = [p for p in _paths(pid) if p.exists()]
    assert made and any(made[0].iterdir()), "the trainer wrote no export (the test proves nothing)"
    return proc, pid


def test_export_is_removed_after_a_clean_stop_and_stale_ones_at_start(tiny_model, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = exports.export_roots()[0] / f"{exports.PREFIX}{gone.pid}"
    (stale / "v7").mkdir(parents=True)
    proc, pid = _push(tiny_model, tmp_path)
    try:
        assert not stale.exists(), "a dead process's export survived a trainer start"
    finally:
        proc.stop()
    assert not any(p.exists() for p in _paths(pid))


def test_export_is_removed_after_the_trainer_is_killed(tiny_model, tmp_path):
    proc, pid = _push(tiny_model, tmp_path)
    ranks = watchdog.descendants(pid)
    assert ranks
    watchdog.kill_tree(pid)  # torchrun and its ranks die without any cleanup of their own
    deadline = time.monotonic() + 30
    while proc.alive() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.alive() is not None
    proc.kill()  # what the controller does with a dead trainer
    assert not any(p.exists() for p in _paths(pid))
    deadline = time.monotonic() + 10
    while (left := [r for r in ranks if _running(r)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "trainer ranks outlived the test"


def _spade_train(tiny_model, tmp_path, run_dir, max_steps: int) -> subprocess.Popen:
    pool = tmp_path / "pool"
    pool.mkdir(exist_ok=True)
    shutil.copy(HERE / "envs" / "first_letter.py", pool / "first_letter.py")
    sets = [
        "mode=fixed_pool", "schedule=async", f"model={tiny_model}", f"max_steps={max_steps}",
        "replay_envs=1", "initial_memory=''", f"fixed_pool={pool}", "checkpoint_every=1",
        "agent.plays_nohint=8", "agent.max_turns=1", "agent.max_turn_tokens=2",
        "agent.cut_reply='step'",
        "trainer.lr=1e-2", "envs.max_workers=2", "shutdown_grace_s=2",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "spade_async.cli", "train", "configs/cpu-demo.toml",
           "--run-dir", str(run_dir)]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).parents[2], start_new_session=True,
    )  # fmt: skip


def _trainer_pids(run_dir: Path) -> set[int]:
    """torchrun processes of this run (their pids name its exports)."""
    found = set()
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "torch.distributed.run" in cmd and str(run_dir) in cmd:
            found.add(int(d.name))
    return found


def _watch(run_dir: Path, proc: subprocess.Popen, until, timeout: float = 400) -> set[int]:
    """Poll the run, collecting its trainer pids, until ``until()`` or the run exits."""
    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not until() and time.monotonic() < deadline:
        pids |= _trainer_pids(run_dir)
        time.sleep(0.1)
    return pids


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nothing_of_ours_is_left_after_spade_train_and_after_it_is_killed(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    proc = _spade_train(tiny_model, tmp_path, run_dir, max_steps=2)
    pids = _watch(run_dir, proc, lambda: False)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert pids, "never saw the run's trainer"
    assert [p for pid in pids for p in _paths(pid) if p.exists()] == []

    run_dir = tmp_path / "killed"
    proc = _spade_train(tiny_model, tmp_path, run_dir, max_steps=50)
    pids: set[int] = set()

    def exported() -> bool:
        pids.update(_trainer_pids(run_dir))
        return any(p.exists() for pid in pids for p in _paths(pid))

    pids |= _watch(run_dir, proc, exported)
    assert exported(), "the run wrote no export before it was killed (the test proves nothing)"
    proc.kill()  # kill -9 of the controller: only the watchdog outlives it
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while (left := [p for pid in pids for p in _paths(pid) if p.exists()]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert left == []
