"""A short soak (``make test-slow``): bench/soak.py for 40 s in 10 s intervals, the pool
under valid, hostile and crashing environments at full concurrency. Nothing lost, nothing
misjudged, nothing left behind: no process, no worker cgroup, no /dev/shm growth, and the
parent's open fds flat. (Parent RSS growth over a run this short is mostly warm-up: it is
in the JSON, judged by the 20-minute run in bench/results.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).parents[1] / "bench" / "soak.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_loses_and_leaves_nothing():
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", "0.67", "--interval", "10"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    t = out["targets"]
    assert out["totals"]["episodes"] > 0 and out["totals"]["checks"] > 0
    assert out["totals"]["crash_episodes"] > 0
    for key in ("lost_episodes", "misjudged", "processes_left", "dev_shm_back_to_start"):
        assert t[key]["met"], (key, t[key], out["errors"])
    assert t["open_fds_growth"]["met"], t["open_fds_growth"]
    assert len(out["per_interval"]) >= 4
