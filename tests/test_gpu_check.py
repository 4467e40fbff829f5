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
    # every part in one call, scale (LoRA, offload, 32k row) and the end-to-end run included
    assert plan["parts"] == [
        "peak", "kernels", "trainer", "export", "attention", "moe", "sglang", "scale", "e2e"
    ]
    assert plan["sizes"]["kernels"]["timing"]["V"] == 151936
    assert plan["sizes"]["trainer"]["model"]["hidden_size"] == 2048
    budgets = plan["sizes"]["budget_s"]
    # 8 minutes of device time at most, so one rerun fits the 15-minute lease
    assert plan["total_budget_s"] == sum(budgets[p] for p in plan["parts"]) <= 8 * 60
    assert budgets["e2e"] <= 4 * 60 and plan["sizes"]["e2e"]["timeout_s"] < budgets["e2e"]
    assert "total budget 480 s" in proc.stderr
    quick = json.loads(_run("--dry-run", "--quick").stdout.strip().splitlines()[-1])
    assert quick["sizes"]["kernels"]["timing"]["V"] < plan["sizes"]["kernels"]["timing"]["V"]
    assert quick["total_budget_s"] <= 8 * 60


def test_liger_failure_falls_back_to_liger_false_and_says_why(monkeypatch):
    """Issue 34: a Liger kernel that fails at the first step rebuilds the trainer with
    trainer.liger = false (Liger's process-wide rebinding undone) instead of sinking the
    part; later parts inherit it."""
    sys.path.insert(0, str(SCRIPT.parent))
    import transformers.models.llama.modeling_llama as llama
    from gpucheck import trainer as gt

    import spade_async.trainer.step as step
    from spade_async.trainer.config import TrainerConfig

    class FakeTrainer:
        built: list = []

        def __init__(self, cfg, model_dir, device):
            FakeTrainer.built.append(cfg.liger)
            self.cfg = cfg

        def train_step(self, batch):
            if self.cfg.liger is not False:
                raise RuntimeError("triton compile failed in liger_rms_norm")

    monkeypatch.setattr(step, "Trainer", FakeTrainer)
    original = llama.apply_rotary_pos_emb
    ctx = {"device": "cuda", "log": lambda m: None, "model_dir": "m", "modules": gt._Modules()}
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", "liger's rope")  # the patch's rebinding
    cfg = TrainerConfig(model="m")
    result = {}
    trainer, cfg = gt.first_step(ctx, result, FakeTrainer(cfg, "m", None), cfg, None)
    assert cfg.liger is False and FakeTrainer.built == ["auto", False]
    assert "liger = false" in result["liger"] and "triton compile failed" in result["liger"]
    assert llama.apply_rotary_pos_emb is original  # restored before the rebuild
    assert ctx["trainer_overrides"] == {"liger": False} and ctx["liger_fallback"] == "false"
    assert "logprob_backend" not in result  # our own Triton kernels stay on


def test_e2e_records_and_child_path(tmp_path):
    """The end-to-end part reads the policy version after each step from metrics.jsonl and
    gives `spade train` (and the trainer ranks it starts) the repo and kernels/ on
    PYTHONPATH ahead of the carried wheels."""
    sys.path.insert(0, str(SCRIPT.parent))
    from gpucheck import e2e

    recs = [
        {"version": v, "train/seconds": 0.5, "train/tokens_per_s": 100.0 * v, "train/push_s": 0.2}
        for v in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, recs)) + "\n{}\n")
    out = e2e.summarize_records(e2e.read_records(tmp_path / "metrics.jsonl"))
    assert out["versions"] == [1, 2, 3] and out["versions_rise"] and out["lost_batches"] == 0
    assert out["trainer_tokens_per_s_warm"] == 250.0 and out["push_s_warm"] == 0.2
    stuck = e2e.summarize_records([dict(recs[0]), dict(recs[0], **{"train/lost_batches": 1})])
    assert not stuck["versions_rise"] and stuck["lost_batches"] == 1
    env = e2e.child_env({"PYTHONPATH": "/tmp/site", "MASTER_PORT": "29511", "RANK": "0"})
    root = str(SCRIPT.parents[1])
    assert env["PYTHONPATH"].split(":") == [root, root + "/kernels", "/tmp/site"]
    assert "MASTER_PORT" not in env and "RANK" not in env  # the trainer part's group
    cmd = e2e.command(tmp_path / "run", tmp_path / "m", 4, "cuda", "/dev/shm", [])
    assert cmd[1:4] == ["-m", "spade_async.cli", "train"] and "max_steps=4" in cmd
    assert "placement.trainer_gpus=[]" not in cmd  # on the GPU: the config's GPU 0


def test_the_run_loop_does_not_import_pyarrow():
    """The carried wheels leave pyarrow out (55 MB of the 64 MiB carry): `spade train`'s
    import path must not need it unless a parquet or saved-dataset corpus is read."""
    code = (
        "import sys, spade_async.cli.train, spade_async.loop.run, spade_async.loop.runtime; "
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]


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
    assert moe["replay"]["route_mismatch"] == 0.0 and moe["replay_step_ratio"] > 0  # R3


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
@pytest.mark.timeout(600)  # six parts at tiny sizes: ~2 min alone, more on shared cores
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
    assert scale["offload"]["ok"] and scale["lora"]["push"]["bytes"] < scale["full"]["push"]["bytes"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_smoke_e2e_spade_train(tmp_path):
    """`spade train configs/gpu-smoke.toml` end to end with CPU trainer ranks: the policy
    version after each step rises by one, nothing is lost, pushes go through /dev/shm."""
    proc = _run("--device", "cpu", "--quick", "--parts", "e2e", timeout=560)
    assert proc.returncode == 0, proc.stderr[-2000:]
    e2e = json.loads(proc.stdout.strip().splitlines()[-1])["parts"]["e2e"]
    assert e2e["ok"], e2e.get("error", "") + e2e.get("output_tail", "")
    assert e2e["versions"] == [1, 2] and e2e["lost_batches"] == 0 and e2e["exit_code"] == 0
    assert all(x > 0 for x in e2e["push_s"]) and e2e["trainer_tokens_per_s_warm"] > 0


def test_trainer_part_group_moves_cpu_tensors_on_cuda(monkeypatch):
    """Issue 34: the trainer part's group serves the scale part's offload step, whose host
    shards are broadcast and all-reduced as CPU tensors: cpu:gloo,cuda:nccl, not nccl."""
    sys.path.insert(0, str(SCRIPT.parent))
    import torch
    import torch.distributed as dist
    from gpucheck import trainer as gt

    from spade_async.plan.checks import moves_cpu_tensors

    got = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: got.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    gt._init_dist("cuda")
    gt._init_dist("cpu")
    assert got == ["cpu:gloo,cuda:nccl", "gloo"]
    assert all(moves_cpu_tensors(b) for b in got)
