"""bench/gpu_check.py on CPU: it imports, --dry-run lists the plan, bad input exits 2, a
failed or overlong part is reported while the rest run, and the tiny --device cpu --quick
smoke path runs every part for real (gloo, torch row ops, a spawned engine child)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "bench" / "gpu_check.py"


def _run(*args, timeout=240):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts bench/ on sys.path
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_lists_parts_and_sizes():
    proc = _run("--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plan["parts"] == ["peak", "kernels", "trainer", "export", "attention", "moe", "sglang"]
    assert plan["sizes"]["kernels"]["timing"]["V"] == 151936
    assert plan["sizes"]["trainer"]["model"]["hidden_size"] == 2048
    budgets = plan["sizes"]["budget_s"]
    assert sum(budgets[p] for p in plan["parts"]) < 8 * 60  # rerunnable within the lease
    assert budgets["trainer"] + budgets["scale"] < 8 * 60  # the second call: trainer,scale
    quick = json.loads(_run("--dry-run", "--quick").stdout.strip().splitlines()[-1])
    assert quick["sizes"]["kernels"]["timing"]["V"] < plan["sizes"]["kernels"]["timing"]["V"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--parts", "peak,warp"], "unknown part"),
        (["--device", "cpu"], "--quick"),
        ([], "no CUDA device"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, words):
    if not args and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _run(*args)
    assert proc.returncode == 2
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_a_failed_part_is_data_and_a_slow_part_is_cut(gpu_check):
    def broken(ctx, result):
        result["partial"] = 1
        raise ValueError("boom")

    def slow(ctx, result):
        time.sleep(5)

    out = gpu_check.run_part("broken", broken, {}, budget_s=30)
    assert out["ok"] is False and "ValueError: boom" in out["error"] and out["partial"] == 1
    t0 = time.perf_counter()
    out = gpu_check.run_part("slow", slow, {}, budget_s=1)
    assert time.perf_counter() - t0 < 4
    assert out["ok"] is False and "PartTimeout" in out["error"]
    assert gpu_check.summarize({})["train_mfu"] is None


def test_cpu_smoke_kernels():
    proc = _run("--device", "cpu", "--quick", "--parts", "kernels,sglang")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(p["ok"] for p in out["parts"].values()), out["parts"]
    assert out["summary"]["fused_accuracy_ok"] is True
    assert set(out["parts"]["kernels"]["timing"]["T256"]) == {"fused", "naive", "head"}
    assert out["summary"]["head_accuracy_ok"] is True


def test_cpu_smoke_attention_and_moe():
    proc = _run("--device", "cpu", "--quick", "--parts", "attention,moe")
    assert proc.returncode == 0, proc.stderr[-2000:]
    parts = json.loads(proc.stdout.strip().splitlines()[-1])["parts"]
    assert all(p["ok"] for p in parts.values()), parts
    assert parts["attention"]["per_sequence_sdpa"]["fwd_bwd_ms"] > 0
    moe = parts["moe"]
    assert moe["implementations"] == {"grouped_mm": "grouped_mm", "eager": "eager"}
    assert moe["logprob_rel_l2"] < 1e-4 and moe["grouped_speedup"] > 0


@pytest.mark.slow
def test_cpu_smoke_export_without_trainer():
    proc = _run("--device", "cpu", "--quick", "--parts", "export")
    assert proc.returncode == 0, proc.stderr[-2000:]
    export = json.loads(proc.stdout.strip().splitlines()[-1])["parts"]["export"]
    assert export["ok"], export
    assert export["source"] == "fallback bf16 model" and export["weights_match"]
    push = export["pushes"][-1]
    assert push["payload_bytes"] < push["bytes"] / 10  # handles travel, not the data


@pytest.mark.slow
def test_cpu_smoke_runs_every_part(tmp_path):
    parts = "peak,kernels,trainer,export,sglang,scale"
    proc = _run("--device", "cpu", "--quick", "--out", str(tmp_path), "--parts", parts)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == json.loads(line)
    out = json.loads(line)
    parts = out["parts"]
    assert all(p["ok"] for p in parts.values()), {k: p.get("error") for k, p in parts.items()}
    assert out["summary"]["fused_accuracy_ok"] is True
    fp32 = parts["kernels"]["accuracy"]["float32"]["logprob_entropy"]["fused"]
    assert fp32["grad_w"]["rel_l2"] < 1e-5  # fp32 vs float64: roundoff, not a wrong gradient
    train = parts["trainer"]
    assert train["backend"] == "gloo" and train["packed"]["skipped_steps"] == 0
    assert train["head_recompute"]["skipped_steps"] == 0 and "gemm" in train["profile_bins_share"]
    assert (tmp_path / "gpu_check_profile.json").is_file()
    assert train["packed"]["tokens_per_s"] > 0 and train["version"] >= 2
    export = parts["export"]
    assert export["weights_match"] and export["child_exit"] == 0
    assert export["pushes"][-1]["bytes"] == export["pushes"][0]["bytes"] > 0
    assert parts["sglang"].get("skipped") == "sglang not installed" or "error" in parts["sglang"]
    scale = parts["scale"]  # offloaded and long-row steps run on CPU too (LoRA needs peft)
    assert scale["offload"]["tokens_per_s"] > 0 and scale["long_row"]["tokens_per_s"] > 0
