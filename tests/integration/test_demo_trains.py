"""``spade demo`` end to end, as a new user runs it (``make demo``): every one of its three
steps trains and pushes, so it ends at policy version 3. Fails when any step trains nothing
(an empty batch, a step whose version did not move) -- the demo once ended "done: 3 steps,
policy version 0" with every sample dropped. About 7 minutes on 2 cores: slow."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_make_demo_trains_and_pushes_every_step(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "demo", "--run-dir", str(run)],
        cwd=tmp_path,  # not the checkout: the demo finds its recipe and games itself
        capture_output=True,
        text=True,
        timeout=1400,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "done: 3 steps, policy version 3" in log, log[-4000:]
    steps = [
        r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "version" in r
    ]  # fmt: skip
    assert [r["step"] for r in steps] == [1, 2, 3]
    for i, r in enumerate(steps, start=1):
        assert r["version"] == i, r  # trained and pushed at every step
        assert r["batch/samples"] > 0 and not r.get("train/empty_batches"), r
        assert "train/loss" in r and "train/push_s" in r, r
