"""Every bench script's --quick run ends with one JSON line: the machine described and each
target with its measured value (slow: about ten minutes on 2 cores, ``make test-slow``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
# gpu_check.py needs CUDA; tests/test_gpu_check.py covers it on CPU.
SCRIPTS = sorted(
    p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and p.stem != "gpu_check"
)


def test_every_bench_script_is_listed():
    assert set(SCRIPTS) == {
        "env_pool",
        "generation",
        "eval",
        "logprob",
        "memory",
        "pipeline",
        "router",
        "trainer",
    }


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_run_prints_targets_as_json(name):
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hardware"]["cpu"] and out["hardware"]["logical_cores"] >= 1
    assert out["targets"], "a bench reports at least one target"
    for key, t in out["targets"].items():
        assert {"target", "measured", "met"} <= set(t), key
        assert isinstance(t["met"], bool), key
