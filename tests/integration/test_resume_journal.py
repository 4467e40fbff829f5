"""kill -9 between checkpoints, then resume: no finished episode within the staleness bound
is lost (docs/resume.md). `spade train` on the CPU demo config (the tiny model, a fixed pool)
as real subprocesses; the journal is read between the kill and the resume to know what the
dead run had finished."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from test_signals import _gone, spawn_train

from spade_async.episodes import journal as jr
from spade_async.episodes import recovery as rc

EVERY = 4  # checkpoint_every: the kill lands after step EVERY + 2, before step 2 * EVERY


def _start(
    tiny_model: Path, tmp_path: Path, run_dir: Path, max_steps: int, schedule: str
) -> subprocess.Popen:
    sets = [f"schedule={schedule}", f"max_steps={max_steps}", "replay_envs=2",
            f"checkpoint_every={EVERY}", "max_staleness=1", "agent.plays_nohint=4",
            "telemetry.dashboard='off'"]  # fmt: skip
    return spawn_train(tiny_model, tmp_path, run_dir, sets)


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the line a kill cut
            pass
    return out


def _wait_for_trained_step(run_dir: Path, proc: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").is_file() and any(
            r.get("kind") == "step" and r["step"] >= step for r in _records(run_dir)
        ):
            return
        if proc.poll() is not None:
            pytest.fail(f"spade train exited early ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no step {step} within 400 s")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("schedule", ["async", "sync"])
def test_kill9_between_checkpoints_loses_no_finished_episode(tiny_model, tmp_path, schedule):
    run_dir = tmp_path / "run"
    proc = _start(tiny_model, tmp_path, run_dir, max_steps=50, schedule=schedule)
    _wait_for_trained_step(run_dir, proc, EVERY + 2)
    proc.kill()  # SIGKILL between checkpoints EVERY and 2 * EVERY
    proc.wait(timeout=30)
    proc.stdout.close()
    assert not _gone(run_dir, tiny_model)
    done = max(
        int(p.name.split("-")[1])
        for p in (run_dir / "checkpoints").glob("step-*")
        if (p / "DONE").exists()
    )
    assert done == EVERY, "the kill should land between two checkpoints"
    restored = json.loads(
        (run_dir / "checkpoints" / f"step-{done}" / "controller.json").read_text()
    )

    # what the dead run finished after its checkpoint, as its journal holds it
    rec = rc.recover(run_dir / jr.DIR_NAME, done)
    redo_eps = sum(len(t.episodes) for t in rec.redo)
    pending = [rec.episodes[i] for i in rec.pending]
    after_redo = restored["version"] + len(rec.redo)  # every redo step pushes a version
    usable, stale, ahead = rc.split_by_version(pending, after_redo, 1)
    assert rec.redo, "the kill landed after a trained step: its batch is journaled"
    assert [t.step for t in rec.redo] == list(range(done + 1, done + 1 + len(rec.redo)))

    max_steps = done + len(rec.redo) + 2
    resumed = _start(tiny_model, tmp_path, run_dir, max_steps=max_steps, schedule=schedule)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    records = _records(run_dir)
    events = [r["message"] for r in records if r["kind"] == "event"]
    line = [m for m in events if m.startswith("journal: ")][-1]
    last = [r for r in records if r["kind"] == "step"][-1]
    assert last["step"] == max_steps
    redone = last.get("resume/redone_episodes", 0)
    requeued = last.get("resume/requeued", 0)
    trained_back = last.get("resume/requeued_trained", 0)
    lost_within = (redo_eps + len(usable)) - (redone + trained_back)
    print(
        f"\n{schedule}: kill -9 after step {EVERY + 2} (checkpoint {done}): journal held "
        f"{len(rec.redo)} trained step(s) ({redo_eps} episodes) and {len(pending)} finished "
        f"unconsumed episode(s) ({len(usable)} within max_staleness of version {after_redo}, "
        f"{len(stale)} stale, {len(ahead)} ahead), {rec.lost['unfinished']} unfinished, "
        f"{rec.lost['torn']} torn; after resume: {redone} redone, {trained_back}/{requeued} "
        f"requeued trained; lost within the bound: {lost_within}\n{line}"
    )
    assert redone == redo_eps
    assert requeued == len(usable) and trained_back == requeued
    assert lost_within == 0
    assert last.get("resume/lost/stale", 0) == len(stale)
    assert last.get("resume/lost/unfinished", 0) == rec.lost["unfinished"]
    assert "step(s) redone" in line and "lost:" in line
    # the redo landed each step on its original version: the resumed run's last version is
    # the number of steps it trained (every push here succeeds)
    assert last["version"] == max_steps
    # everything trained is checkpointed at max_steps: the journal holds nothing to redo
    after = rc.recover(run_dir / jr.DIR_NAME, max_steps)
    assert after.redo == [] and after.lost["torn"] == 0
    assert not _gone(run_dir, tiny_model)
