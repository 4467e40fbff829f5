"""Peak and trainer parts: measured matmul peak; the project's Trainer as one FSDP2 rank.

The trainer part starts a world-size-1 process group (``cpu:gloo,cuda:nccl`` on CUDA, as
trainer/main.py does under optimizer offload, which the scale part runs; gloo on CPU; env://),
writes a random Qwen3-shaped model (bf16 safetensors, in /dev/shm when it has 8 GiB free), builds
``spade_async.trainer.step.Trainer`` on it (fp32 masters, bf16 compute, FSDP2 per decoder
block, the varlen attention the trainer picks) and times packed ``train_step``s on a
long-tailed batch, then padded ones (arrival order, each micro-batch padded to its longest)
and length-sorted buckets (``padded_sorted``), for the ratios.
MFU = model flops / step time / the ``peak`` part's measured matmul flops; model flops per
step = 6 * decoder params * tokens + 6 * V * D * loss tokens + 6 * L * H * hd * sum(len^2)
(causal attention, forward + backward; recomputation is not counted).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import statistics
import tempfile
import time

import torch


def peak_part(ctx: dict, result: dict) -> None:
    cfg, device = ctx["sizes"]["peak"], ctx["device"]
    dtype = getattr(torch, cfg["dtype"])
    n = cfg["n"]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(10):  # warm-up: cuBLAS heuristics, clocks
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(cfg["reps"]):
        a @ b
    sync()
    secs = time.perf_counter() - t0
    flops = 2 * n**3 * cfg["reps"] / secs
    result.update(matmul_n=n, dtype=cfg["dtype"], tflops=round(flops / 1e12, 2))
    ctx["peak_flops"] = flops


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_dist(device: str) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    from spade_async.trainer.main import backend

    if device == "cuda":
        torch.cuda.set_device(0)
    # one group for every part: the scale part's offload step moves CPU tensors (its
    # state-dict broadcast and gradient-norm all-reduce), so cpu:gloo,cuda:nccl on CUDA
    dist.init_process_group(backend(device == "cuda", "optimizer"), init_method="env://")


def _sweep_stale(root: str) -> None:
    """Model dirs of gpu_check runs that died before their cleanup (the pid in the name is
    gone): RAM in /dev/shm outlives its run otherwise."""
    import glob

    for d in glob.glob(os.path.join(root, "spade-gpucheck-*")):
        pid = os.path.basename(d).split("-")[2]
        if not pid.isdigit() or not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)


def write_model(spec: dict, device: str) -> str:
    from transformers import AutoModelForCausalLM, Qwen3Config

    # /dev/shm when it has room (containers often give it 64 MiB), else the temp dir
    shm = os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > 8 << 30
    root = "/dev/shm" if shm else None
    _sweep_stale(root or tempfile.gettempdir())
    path = tempfile.mkdtemp(prefix=f"spade-gpucheck-{os.getpid()}-", dir=root)
    config = Qwen3Config(**spec, max_position_embeddings=32768)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    return path


def long_tail(n_tokens: int, vocab: int, lo: int, hi: int, seed: int = 0):
    """Samples of log-normal lengths in [lo, hi] summing to ~n_tokens; last 60% is trained."""
    from spade_async.trainer.batch import Batch, Sample

    rng = random.Random(seed)
    samples, total = [], 0
    while total < n_tokens:
        n = int(min(hi, max(lo, rng.lognormvariate(6.0, 0.9))))
        n = min(n, max(lo, n_tokens - total))
        k = max(1, int(n * 0.4))
        samples.append(
            Sample(
                token_ids=[rng.randrange(vocab) for _ in range(n)],
                loss_mask=[0] * k + [1] * (n - k),
                advantage=rng.choice((-1.0, 1.0)),
                rollout_logprobs=[0.0] * k + [-rng.uniform(0.1, 8.0) for _ in range(n - k)],
            )
        )
        total += n
    return Batch(samples=samples)


def model_flops(causal_lm, batch) -> float:
    cfg = causal_lm.config
    decoder = sum(p.numel() for layer in causal_lm.model.layers for p in layer.parameters())
    lens = [len(s.token_ids) for s in batch.samples]
    loss_tok = sum(sum(s.loss_mask) for s in batch.samples)
    attn = 6 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    return (
        6 * decoder * sum(lens)
        + 6 * cfg.vocab_size * cfg.hidden_size * loss_tok
        + attn * sum(n * n for n in lens)
    )


def _steps(trainer, batch, n: int, layout: str) -> dict:
    trainer.train_step(batch, layout=layout)  # warm-up (allocator, kernels)
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    secs, metrics = [], {}
    for _ in range(n):
        metrics = trainer.train_step(batch, layout=layout)
        secs.append(metrics["seconds"])
    out = {
        "step_s": round(statistics.median(secs), 4),
        "tokens_per_s": round(metrics["tokens"] / statistics.median(secs), 1),
        "micro_batches": int(metrics["micro_batches"]),
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "skipped_steps": int(metrics["skipped_steps"]),
    }
    if trainer.device.type == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


class _Modules:
    """Liger's patch rebinds names in transformers' modeling modules process-wide (liger.py):
    a snapshot of those modules, restored before the trainer is rebuilt with liger off."""

    def __init__(self):
        import sys

        self.saved = {
            name: dict(vars(mod))
            for name, mod in list(sys.modules.items())
            if name.startswith("transformers.models.") and ".modeling_" in name
        }

    def restore(self) -> None:
        import sys

        for name, saved in self.saved.items():
            mod = sys.modules.get(name)
            if mod is not None:
                vars(mod).update(saved)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def first_step(ctx: dict, result: dict, trainer, tcfg, batch):
    """The first packed step, with fallbacks that keep the trainer measurable: a failing
    Liger kernel -> the same trainer rebuilt with ``liger = false`` (said in ``liger``, and
    ``ctx["trainer_overrides"]`` for the scale and e2e parts); then a failing Triton row
    pass -> torch row ops. Returns the (trainer, config) that stepped."""
    import msgspec

    from spade_async.trainer.step import Trainer

    device, log = ctx["device"], ctx["log"]
    try:
        trainer.train_step(batch)
        return trainer, tcfg
    except Exception as exc:  # noqa: BLE001 - a kernel failure must not hide the trainer
        if device != "cuda":
            raise
        first = exc
    if tcfg.liger is not False:  # Liger first: its kernels compile at the first forward
        ctx.pop("trainer", None)
        del trainer
        torch.cuda.empty_cache()
        ctx["modules"].restore()
        tcfg = msgspec.structs.replace(tcfg, liger=False)
        ctx["trainer_overrides"] = {"liger": False}
        ctx["liger_fallback"] = "false"
        result["liger"] = f"off: liger = false after the first step failed ({_why(first)})"
        log(f"trainer: {result['liger']}")
        trainer = ctx["trainer"] = Trainer(tcfg, ctx["model_dir"], torch.device(device))
        try:
            trainer.train_step(batch)
            return trainer, tcfg
        except Exception as exc:  # noqa: BLE001 - then our own Triton kernels
            first = exc
    import spade_kernels.dispatch as dispatch

    dispatch.triton_available = lambda: False  # auto -> torch row ops from here on
    trainer.optimizer.zero_grad(set_to_none=True)  # drop a half-done step's gradients
    result["logprob_backend"] = f"torch (triton failed: {_why(first)})"
    log(f"trainer: {result['logprob_backend']}")
    trainer.train_step(batch)  # a third failure is the part's error
    return trainer, tcfg


def trainer_part(ctx: dict, result: dict) -> None:
    import msgspec

    from spade_async.trainer.config import TrainerConfig
    from spade_async.trainer.model import kernels_line
    from spade_async.trainer.step import Trainer

    device, cfg, log = ctx["device"], ctx["sizes"]["trainer"], ctx["log"]
    _init_dist(device)
    result["backend"] = torch.distributed.get_backend()
    t0 = time.perf_counter()
    model_dir = ctx["model_dir"] = write_model(cfg["model"], device)
    result["write_model_s"] = round(time.perf_counter() - t0, 2)
    log(f"trainer: random model written to {model_dir} in {result['write_model_s']} s")
    t0 = time.perf_counter()
    tcfg = TrainerConfig(model=model_dir, micro_batch_tokens=cfg["micro_batch_tokens"], lr=1e-6)
    ctx["modules"] = _Modules()  # before Liger patches anything
    trainer = ctx["trainer"] = Trainer(tcfg, model_dir, torch.device(device))
    lm = trainer.model.causal_lm
    result.update(
        load_s=round(time.perf_counter() - t0, 2),
        params=sum(p.numel() for p in lm.parameters()),
        attn_implementation=lm.config._attn_implementation,
        fsdp=type(trainer.model).__name__,
    )
    log(
        f"trainer: loaded {result['params'] / 1e9:.3f}B params, attn {result['attn_implementation']}"
    )
    batch = long_tail(cfg["batch_tokens"], lm.config.vocab_size, cfg["min_len"], cfg["max_len"])
    result["batch"] = {
        "samples": len(batch.samples),
        "tokens": sum(len(s.token_ids) for s in batch.samples),
        "loss_tokens": sum(sum(s.loss_mask) for s in batch.samples),
        "longest": max(len(s.token_ids) for s in batch.samples),
    }
    flops = model_flops(lm, batch)
    result["model_flops_per_step"] = flops
    result["logprob_backend"] = "triton" if device == "cuda" else "torch"
    result["liger"] = "on" if device == "cuda" and tcfg.liger is not False else "off"
    trainer, tcfg = first_step(ctx, result, trainer, tcfg, batch)
    result["kernels"] = kernels_line(tcfg, device == "cuda")
    for layout in ("packed", "padded", "padded_sorted"):
        r = result[layout] = _steps(trainer, batch, cfg["steps"], layout)
        if ctx.get("peak_flops") and device == "cuda":
            r["mfu"] = round(flops / r["step_s"] / ctx["peak_flops"], 4)
        log(f"trainer: {layout} {r}")
    for layout in ("padded", "padded_sorted"):
        result[f"packed_vs_{layout}"] = round(
            result["packed"]["tokens_per_s"] / result[layout]["tokens_per_s"], 3
        )
    from gpucheck.profile import profile_step

    prof = profile_step(lambda: trainer.train_step(batch, layout="packed"), device)
    ctx["profile"] = prof
    result["profile_bins_share"] = prof["bins_share"]
    log(f"trainer: profile {prof['bins_ms']}")
    result["version"] = trainer.version
    # the same step without Liger's kernels (and the recompute head, for the ratio)
    for name, change in (
        ("liger_off", {"liger": False}),
        ("head_recompute", {"head": "recompute"}),
    ):
        if name == "liger_off" and (device != "cuda" or tcfg.liger is False):
            why = "liger runs on CUDA only" if device != "cuda" else result["liger"]
            result[name] = {"skipped": why}
            continue
        ctx.pop("trainer", None)
        del trainer
        if device == "cuda":
            torch.cuda.empty_cache()
        if change.get("liger") is False:  # undo Liger's process-wide rebinding too
            ctx["modules"].restore()
        alt_cfg = msgspec.structs.replace(tcfg, **change)
        trainer = ctx["trainer"] = Trainer(alt_cfg, model_dir, torch.device(device))
        r = result[name] = _steps(trainer, batch, cfg["steps"], "packed")
        if ctx.get("peak_flops") and device == "cuda":
            r["mfu"] = round(flops / r["step_s"] / ctx["peak_flops"], 4)
        result[f"packed_vs_{name}"] = round(result["packed"]["tokens_per_s"] / r["tokens_per_s"], 3)
        log(f"trainer: {name} {r}")


def close(ctx: dict) -> None:
    """Tear down what the parts left (process group, model dir)."""
    import torch.distributed as dist

    ctx.pop("trainer", None)
    if ctx.get("model_dir"):
        shutil.rmtree(ctx.pop("model_dir"), ignore_errors=True)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
