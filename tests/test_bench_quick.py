"""Every bench script's --quick run ends with one JSON line: the machine described and each
target with its measured value (slow: about ten minutes on 2 cores, ``make test-slow``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
# gpu_check.py needs CUDA; tests/test_gpu_check.py covers it on CPU. doc_figures.py is not a
# bench but the tool that writes saved figures into docs pages (tests/test_throughput_doc.py).
NOT_BENCHES = {"gpu_check", "doc_figures"}
SCRIPTS = sorted(
    p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and p.stem not in NOT_BENCHES
)


def test_every_bench_script_is_listed():
    assert set(SCRIPTS) == {
        "async_lab",
        "audit_cost",
        "env_check",
        "env_pool",
        "generation",
        "eval",
        "heldout",
        "heldout_interleaved",
        "interop",
        "logprob",
        "lora_push",
        "memory",
        "pipeline",
        "report",
        "router",
        "routing_replay",
        "scale_ab",
        "simulate",
        "soak",
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


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("logprob", ["--device", "cuda", "--quick"], "CUDA"),
        ("trainer", ["--ranks", "x"], "--ranks"),
        ("trainer", ["--model", "/nonexistent"], "config.json"),
        ("memory", ["--sizes", "1k"], "--sizes"),
    ],
)
def test_a_workload_that_cannot_run_is_one_line_exit_2(script, args, words):
    if script == "logprob" and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-500:]
    assert proc.stderr.startswith("error: ") and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
