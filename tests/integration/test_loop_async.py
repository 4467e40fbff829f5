"""The async schedule on CPU with a tiny model: overlap, staleness bound, versions, no leaks."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest
from loop_helpers import HERE, _config, _run, _steps

from spade_async import recipe
from spade_async.rundir import RunDir


def _children() -> list[int]:
    """Live (non-zombie) processes whose parent is this test process."""
    me, out = str(os.getpid()), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                out.append(int(d.name))
    return out


@pytest.mark.timeout(600)
def test_async_fixed_pool_staleness_and_versions(tiny_model, tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    shutil.copy(HERE / "envs" / "first_letter.py", pool / "first_letter.py")
    cfg = recipe.load(
        None,
        [
            "mode='fixed_pool'",
            "schedule='async'",
            f"model='{tiny_model}'",
            "max_steps=4",
            "replay_envs=1",
            "initial_memory=''",
            f"fixed_pool='{pool}'",
            "checkpoint_every=2",
            "max_staleness=1",
            "agent.plays_nohint=8",
            "agent.max_turns=1",
            "agent.max_turn_tokens=2",
            "agent.cut_reply='step'",  # a cut 1-token reply is the action
            "agent.temperature=1.0",
            "trainer.lr=1e-2",
            "telemetry.dashboard='off'",
            "envs.max_workers=2",
            "pipeline.groups_in_flight=2",
            "pipeline.queue_groups=2",
        ],
    )
    run_dir = RunDir(tmp_path / "run")
    before = set(_children())
    gc_before = gc.get_threshold()
    _run(cfg, run_dir)
    assert gc.get_threshold() == gc_before  # the loop's GC setting ends with its run
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["batch/max_agent_age"] <= 1 for r in steps), [
        r["batch/max_agent_age"] for r in steps
    ]
    assert all(
        r["batch/versions"] for r in steps if r["batch/samples"]
    )  # every sample's version kept
    assert steps[-1]["version"] >= 2
    assert "stream/groups/fill" in steps[-1]
    assert set(_children()) <= before, "an engine, trainer rank or worker outlived the run"


@pytest.mark.timeout(600)
def test_async_spade_mode(tiny_model, tmp_path):
    cfg = _config(tiny_model, tmp_path, "spade", schedule="'async'")
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[-1]["designer/generated"] >= 2
    assert run_dir.latest_checkpoint()[0] == 2
