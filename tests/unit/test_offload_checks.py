"""trainer.offload = "optimizer" where it cannot run (issue 34): on trainer ranks without
CUDA, or with a process-group backend that cannot move CPU tensors (the host shards'
state-dict broadcast and gradient-norm all-reduce), one ConfigError line: at start, and
said by the dry run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spade_async.errors import ConfigError
from spade_async.plan import checks
from spade_async.trainer.main import backend

ROOT = Path(__file__).parents[2]
SMOKE = ROOT / "configs" / "gpu-smoke.toml"


def test_offload_problem_names_cuda_and_the_backend():
    assert checks.offload_problem("none", False, "gloo") is None
    assert checks.offload_problem("optimizer", True, "cpu:gloo,cuda:nccl") is None
    assert checks.offload_problem("optimizer", True, "gloo") is None  # gloo moves both
    no_cuda = checks.offload_problem("optimizer", False, "gloo")
    assert "needs CUDA" in no_cuda and "\n" not in no_cuda
    plain = checks.offload_problem("optimizer", True, "nccl")
    assert "'nccl' cannot move CPU tensors" in plain and "cpu:gloo,cuda:nccl" in plain
    assert checks.offload_problem("optimizer", True, "cuda:nccl") is not None
    # what the GPU trainer ranks start with under offload, and without it
    assert checks.offload_problem("optimizer", True, backend(True, "optimizer")) is None
    assert checks.offload_problem("optimizer", True, backend(True, "none")) is not None


def _cfg(offload: str):
    from spade_async import recipe

    return recipe.load(SMOKE, [f"trainer.offload={offload}"])


def test_start_without_cuda_refuses_offload_in_one_line(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs CUDA on the trainer ranks"):
        checks.check_start(_cfg("optimizer"))
    checks.check_start(_cfg("none"))


def test_a_backend_without_cpu_refuses_offload_at_load(monkeypatch):
    """A regression of trainer/main.py's backend() to plain NCCL is refused when the recipe
    loads (start and --dry-run alike), before any rank dies at its first forward."""
    import spade_async.trainer.main as main

    monkeypatch.setattr(main, "backend", lambda cuda, offload="none": "nccl")
    with pytest.raises(ConfigError, match="cannot move CPU tensors"):
        _cfg("optimizer")
    _cfg("none")


def test_dry_run_says_the_start_would_stop(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "train", str(SMOKE), "--dry-run",
         "--set", "trainer.offload=optimizer", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert proc.returncode == 0, proc.stderr
    assert "a real start would stop: trainer.offload" in proc.stdout + proc.stderr
