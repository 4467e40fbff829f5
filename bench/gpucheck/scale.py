"""Scale part (issues 25, 34): an optimizer-offloaded step and a LoRA step (with its adapter
push) beside full fine-tuning on the trainer part's model, and one long packed row (32k
tokens on the GPU, sequence parallel off). In the default run.

Runs after the ``trainer`` part (its random Qwen3-shaped model and its packed tokens/s are
the baseline, measured in the same run), in the order full, offload, lora, long row, so a
part budget cut loses the least asked-for entry. Each sub-check is guarded: a failure
(peft missing, an OOM) is reported in its own entry with ``ok: false`` and the others
still run. ``push``: the trainer side of a weight push into shared memory (gather, cast to
bf16, write safetensors), the full model's for ``full`` and the adapter's for ``lora``
(what ``/update_weights_from_disk`` and ``/load_lora_adapter`` read): ``bytes``, ``seconds``.
"""

from __future__ import annotations

import gc
import random
import time

import torch


def _row(n: int, vocab: int, seed: int = 1):
    from spade_async.trainer.batch import Batch, Sample

    rng = random.Random(seed)
    k = n // 4
    return Batch(
        samples=[
            Sample(
                token_ids=[rng.randrange(vocab) for _ in range(n)],
                loss_mask=[0] * k + [1] * (n - k),
                advantage=1.0,
                rollout_logprobs=[0.0] * k + [-1.0] * (n - k),
            )
        ]
    )


def _push(trainer, kind: str) -> dict:
    """The trainer side of one push into shared memory: bytes written and seconds."""
    import shutil
    import tempfile
    from pathlib import Path

    from spade_async.trainer.push_common import shm_root as _shm_root

    root = Path(tempfile.mkdtemp(dir=_shm_root(""), prefix="spade-gpucheck-push-"))
    try:
        t0 = time.perf_counter()
        if kind == "adapter":
            from spade_async.trainer.lora import export_adapter

            export_adapter(trainer, root / "adapter")
        else:
            from spade_async.trainer.stream import export_safetensors

            export_safetensors(trainer, root / "model", torch.bfloat16, 1 << 30)
        secs = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in root.rglob("*.safetensors"))
        return {"kind": kind, "bytes": size, "seconds": round(secs, 3), "dir": str(root.parent)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(make, batch, steps: int, device: str, push: str = "") -> dict:
    trainer = make()
    try:
        trainer.train_step(batch)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        secs, m = [], {}
        for _ in range(steps):
            m = trainer.train_step(batch)
            secs.append(m["seconds"])
        s = sorted(secs)[len(secs) // 2]
        out = {"step_s": round(s, 4), "tokens_per_s": round(m["tokens"] / s, 1)}
        out["trainable_params"] = sum(
            p.numel() for p in trainer.model.parameters() if p.requires_grad
        )
        if device == "cuda":
            out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["version"] = trainer.version
        if push:
            out["push"] = _push(trainer, push)
        return out
    finally:
        del trainer
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def scale_part(ctx: dict, result: dict) -> None:
    import msgspec

    from gpucheck.trainer import _init_dist, long_tail, write_model
    from spade_async.trainer.config import LoraConfig, TrainerConfig
    from spade_async.trainer.step import Trainer

    device, cfg, log = ctx["device"], ctx["sizes"]["scale"], ctx["log"]
    tcfg_sizes = ctx["sizes"]["trainer"]
    _init_dist(device)
    if not ctx.get("model_dir"):  # close() removes it with the trainer part's
        ctx["model_dir"] = write_model(tcfg_sizes["model"], device)
    model_dir = ctx["model_dir"]
    ctx["model_dir"] = model_dir
    if "trainer" in ctx:  # the trainer part's Trainer: free its memory first
        del ctx["trainer"]
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    vocab = tcfg_sizes["model"]["vocab_size"]
    batch = long_tail(
        tcfg_sizes["batch_tokens"], vocab, tcfg_sizes["min_len"], tcfg_sizes["max_len"]
    )
    base = TrainerConfig(
        model=model_dir,
        micro_batch_tokens=tcfg_sizes["micro_batch_tokens"],
        lr=1e-6,
        sequence_parallel=1,
        **ctx.get("trainer_overrides", {}),  # liger = false after a Liger failure
    )
    dev = torch.device(device)
    variants = {  # offload before lora: the recipe that needs it is the 30B one on H100s
        "full": (base, "model"),
        "offload": (msgspec.structs.replace(base, offload="optimizer"), ""),
        "lora": (msgspec.structs.replace(base, lora=LoraConfig(rank=cfg["lora_rank"])), "adapter"),
    }
    for name, (tc, push) in variants.items():
        try:
            result[name] = _measure(
                lambda tc=tc: Trainer(tc, model_dir, dev), batch, cfg["steps"], device, push
            )
            result[name]["ok"] = True
        except Exception as exc:  # noqa: BLE001 - one variant's failure is data
            result[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
        log(f"scale: {name} {result[name]}")
    full = result["full"].get("tokens_per_s")
    for name in ("lora", "offload"):
        got = result[name].get("tokens_per_s")
        result[f"{name}_vs_full"] = round(got / full, 3) if got and full else None
    full_push, lora_push = (result[k].get("push") or {} for k in ("full", "lora"))
    if full_push.get("bytes") and lora_push.get("bytes"):
        result["adapter_push_bytes_vs_full"] = round(lora_push["bytes"] / full_push["bytes"], 5)
        result["adapter_push_time_vs_full"] = round(
            lora_push["seconds"] / max(full_push["seconds"], 1e-9), 4
        )
    n = cfg["row_tokens"]
    long_cfg = msgspec.structs.replace(base, micro_batch_tokens=n, activation_checkpointing=True)
    t0 = time.perf_counter()
    try:
        result["long_row"] = _measure(
            lambda: Trainer(long_cfg, model_dir, dev), _row(n, vocab), 1, device
        )
        result["long_row"].update(tokens=n, ok=True)
    except Exception as exc:  # noqa: BLE001 - an OOM at 32k is the answer
        result["long_row"] = {
            "tokens": n,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:400],
        }
    result["long_row"]["seconds"] = round(time.perf_counter() - t0, 2)
    log(f"scale: long row {result['long_row']}")
    # the part is ok only when every entry is: a failed offload step must not read as a pass
    bad = [k for k in ("full", "offload", "lora", "long_row") if not result[k].get("ok")]
    if bad:
        result["ok"] = False
        result["error"] = "; ".join(f"{k}: {result[k].get('error')}" for k in bad)[:600]
