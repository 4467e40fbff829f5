"""End-to-end part: ``spade train configs/gpu-smoke.toml`` with the trainer on the GPU.

The part writes a random Qwen3-shaped model on the device (bf16 safetensors) with the
tokenizer carried in ``.whl/tokenizer`` (``bench/gpu_wheels.sh`` copies it there; here, the
embedded SmolLM2 tokenizer from the cache), then runs ``python -m spade_async.cli train``
as a child (its own session, killed as a group when it runs past ``timeout_s``): one FSDP2
trainer rank on GPU 0, the project's CPU engine on the host's cores, the demo games as a
fixed pool, weights pushed through shared memory (``/dev/shm`` when it has room for a few
pushes, else the temp dir, named in ``push_dir``) after every step.

Recorded from the run's metrics.jsonl: ``versions`` (the policy version after each step;
``versions_rise`` = 1, 2, ..., n), ``lost_batches`` (must be 0), per step ``train_s``,
``trainer_tokens_per_s`` and ``push_s``; the child's exit code and the tail of its output.
On the GPU machine the project is not installed: the child's PYTHONPATH carries the repo
root, ``kernels/`` (``spade_kernels``) and this process's PYTHONPATH (the wheels' /tmp/site),
so the trainer ranks it launches with ``sys.executable -m ...`` import the same code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "gpu-smoke.toml"
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tokenizer_source() -> Path:
    """.whl/tokenizer when the wheel folder carries one (the GPU machine), else the cache."""
    carried = ROOT / ".whl" / "tokenizer"
    if (carried / "tokenizer_config.json").is_file():
        return carried
    from spade_async.models import tokenizer_dir

    return tokenizer_dir("smollm2-135m-instruct")


def child_env(base: dict | None = None) -> dict:
    """The child's environment: repo root and kernels/ first on PYTHONPATH, then what this
    process was given (the wheels' target dir on the GPU machine)."""
    env = dict(os.environ if base is None else base)
    # the trainer part's world-size-1 group set these in this process: torchrun's ranks
    # in the child get their own, and nothing in the controller may read ours
    for key in DIST_ENV:
        env.pop(key, None)
    parts = [str(ROOT), str(ROOT / "kernels")]
    parts += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def write_smoke_model(spec: dict, device: str, path: Path) -> Path:
    """A random Qwen3-shaped model of ``spec`` with the carried tokenizer, written on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tok_dir = tokenizer_source()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    eos = tok.eos_token_id
    config = Qwen3Config(
        **spec,
        vocab_size=len(tok),
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    for name in TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copy(tok_dir / name, path / name)
    return path


def push_dir(model_bytes: int) -> tuple[str, bool]:
    """(directory for the weight pushes, is it shared memory): /dev/shm when it holds four
    bf16 copies (containers often give it 64 MiB), else the temp dir."""
    shm = "/dev/shm"
    if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 * model_bytes:
        return shm, True
    return tempfile.gettempdir(), False


def command(
    run_dir: Path, model_dir: Path, steps: int, device: str, weight_dir: str, extra: list[str]
) -> list[str]:
    sets = [f"model={model_dir}", f"max_steps={steps}", f"placement.weight_dir={weight_dir}"]
    if device != "cuda":  # the CPU smoke test: the same run with CPU trainer ranks
        sets += ["placement.trainer_gpus=[]", "trainer.mixed_precision=false"]
    sets += extra
    cmd = [sys.executable, "-m", "spade_async.cli", "train", str(CONFIG), "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def read_records(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "version" in rec and "train/seconds" in rec:
            out.append(rec)
    return out


def summarize_records(records: list[dict]) -> dict:
    """Per step: the policy version, trainer seconds and tokens/s, push seconds."""
    versions = [int(r["version"]) for r in records]
    lost = max((int(r.get("train/lost_batches", 0) or 0) for r in records), default=0)
    tps = [r.get("train/tokens_per_s") for r in records]
    push = [r.get("train/push_s", r.get("push_s")) for r in records]  # cycle.py: train/ + push
    out = {
        "steps": len(records),
        "versions": versions,
        "versions_rise": versions == list(range(1, len(versions) + 1)) and bool(versions),
        "lost_batches": lost,
        "train_s": [r.get("train/seconds") for r in records],
        "trainer_tokens_per_s": tps,
        "push_s": push,
    }
    warm_tps = [x for x in tps[1:] if x] or [x for x in tps if x]
    warm_push = [x for x in push[1:] if x] or [x for x in push if x]
    out["trainer_tokens_per_s_warm"] = round(sum(warm_tps) / len(warm_tps), 1) if warm_tps else None
    out["push_s_warm"] = round(sum(warm_push) / len(warm_push), 3) if warm_push else None
    return out


def e2e_part(ctx: dict, result: dict) -> None:
    device, cfg, log = ctx["device"], ctx["sizes"]["e2e"], ctx["log"]
    work = Path(tempfile.mkdtemp(prefix=f"spade-gpucheck-e2e-{os.getpid()}-"))
    try:
        t0 = time.perf_counter()
        model_dir = write_smoke_model(cfg["model"], device, work / "model")
        size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        result.update(write_model_s=round(time.perf_counter() - t0, 2), model_bytes=size)
        weight_dir, is_shm = push_dir(size)
        result.update(push_dir=weight_dir, push_through_shm=is_shm)
        extra = [f"trainer.liger={ctx['liger_fallback']}"] if ctx.get("liger_fallback") else []
        cmd = command(work / "run", model_dir, cfg["steps"], device, weight_dir, extra)
        result["command"] = " ".join(cmd[1:])
        log(f"e2e: {result['command']}")
        t0 = time.perf_counter()
        out_file = work / "train.log"
        env = child_env()
        if (
            device == "cuda"
            and "CUDA_VISIBLE_DEVICES" not in env
            and not shutil.which("nvidia-smi")
        ):
            import torch  # placement finds GPUs by nvidia-smi, else by this variable

            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(torch.cuda.device_count())))
            result["cuda_visible_devices"] = env["CUDA_VISIBLE_DEVICES"]
        with open(out_file, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=cfg["timeout_s"])
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                if proc.poll() is None:  # ours, its own session: the controller and its children
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
        result["train_wall_s"] = round(time.perf_counter() - t0, 2)
        result["exit_code"] = rc
        result.update(summarize_records(read_records(work / "run" / "metrics.jsonl")))
        tail = out_file.read_text(errors="replace")[-1500:]
        log(f"e2e: exit {rc}, versions {result.get('versions')}, push {result.get('push_s')}")
        problems = []
        if rc is None:
            problems.append(f"spade train ran past {cfg['timeout_s']} s")
        elif rc != 0:
            problems.append(f"spade train exited {rc}")
        if result["steps"] < cfg["steps"]:
            problems.append(f"{result['steps']} of {cfg['steps']} steps recorded")
        if not result["versions_rise"]:
            problems.append(f"policy versions {result['versions']} do not rise by one a step")
        if result["lost_batches"]:
            problems.append(f"{result['lost_batches']} lost batches")
        if problems:
            result["output_tail"] = tail
            result["ok"] = False
            result["error"] = "; ".join(problems)
    finally:
        shutil.rmtree(work, ignore_errors=True)
