"""A `make demo`-like run (configs/cpu-demo.toml, async, 3 steps, the bundled environments)
with the tiny model: every episode it played replays exactly, and `spade report` renders it."""

from __future__ import annotations

import shutil

import pytest

from spade_async import recipe
from spade_async.cli import main as spade
from spade_async.cli.demo import RECIPE
from spade_async.episodes.records import read_records
from spade_async.episodes.replay import read_summary
from spade_async.rundir import RunDir
from spade_async.telemetry.metrics import read_metrics


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_like_run_replays_exactly_and_reports(tiny_model, tmp_path):
    from loop_helpers import HERE, _run

    pool = tmp_path / "pool"  # environments with varied rewards, so the trainer steps
    pool.mkdir()
    for name in ("lower_share.py", "first_letter.py"):
        shutil.copy(HERE / "envs" / name, pool / name)
    cfg = recipe.load(
        RECIPE,
        [f"model='{tiny_model}'", "designer.max_new_tokens=24", "hint.max_new_tokens=8",
         "telemetry.dashboard='off'", "envs.max_workers=4", f"fixed_pool='{pool}'",
         "replay_envs=4", "agent.max_turn_tokens=4"],
    )  # fmt: skip
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    recs, bad = read_records(run_dir.root)
    assert bad == 0 and len(recs) >= 12, len(recs)
    assert spade(["episode", "replay", str(run_dir.root), "--all"]) == 0
    summary = read_summary(run_dir.root)
    assert summary.share == 1.0 and summary.checked == len(recs)
    out = tmp_path / "report"
    assert spade(["report", str(run_dir.root), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "replay exactly" in page and "<svg" in page
    steps = [r for r in read_metrics(run_dir.metrics) if r["kind"] == "step"]
    assert any("train/mismatch_kl" in r for r in steps), "the trainer stepped"
