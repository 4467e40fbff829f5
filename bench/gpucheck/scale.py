"""Scale part (issue 25): a LoRA step and an optimizer-offloaded step beside full
fine-tuning on the trainer part's model, and one long packed row (32k tokens on the GPU).

Runs after the ``trainer`` part (its random Qwen3-shaped model and its packed tokens/s are
the baseline, measured in the same run). Each sub-check is guarded: a failure (peft
missing, an OOM) is reported in its own entry and the others still run.
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


def _measure(make, batch, steps: int, device: str) -> dict:
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
        model=model_dir, micro_batch_tokens=tcfg_sizes["micro_batch_tokens"], lr=1e-6
    )
    dev = torch.device(device)
    variants = {
        "full": base,
        "lora": msgspec.structs.replace(base, lora=LoraConfig(rank=cfg["lora_rank"])),
        "offload": msgspec.structs.replace(base, offload="optimizer"),
    }
    for name, tc in variants.items():
        try:
            result[name] = _measure(
                lambda tc=tc: Trainer(tc, model_dir, dev), batch, cfg["steps"], device
            )
        except Exception as exc:  # noqa: BLE001 - one variant's failure is data
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        log(f"scale: {name} {result[name]}")
    full = result["full"].get("tokens_per_s")
    for name in ("lora", "offload"):
        got = result[name].get("tokens_per_s")
        result[f"{name}_vs_full"] = round(got / full, 3) if got and full else None
    n = cfg["row_tokens"]
    long_cfg = msgspec.structs.replace(base, micro_batch_tokens=n, activation_checkpointing=True)
    t0 = time.perf_counter()
    try:
        result["long_row"] = _measure(
            lambda: Trainer(long_cfg, model_dir, dev), _row(n, vocab), 1, device
        )
        result["long_row"]["tokens"] = n
    except Exception as exc:  # noqa: BLE001 - an OOM at 32k is the answer
        result["long_row"] = {"tokens": n, "error": f"{type(exc).__name__}: {exc}"[:400]}
    result["long_row"]["seconds"] = round(time.perf_counter() - t0, 2)
    log(f"scale: long row {result['long_row']}")
