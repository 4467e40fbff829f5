"""What one trainer GPU is expected to hold, for the dry-run plan (before any GPU is touched).

Counted from the model's ``config.json`` on a meta-device model (exact parameter counts, no
memory), for FSDP2 over R ranks as model.py / sharded.py run it:

- sharded state, 16 B/param / R: fp32 weights, fp32 gradients, AdamW's two fp32 moments;
- unsharded while computing: the root group (embeddings, final norm, head) for the whole
  forward, plus about two decoder blocks (the one running and the one prefetched), in the
  compute dtype (bf16 with mixed precision on GPU, else fp32), plus one block of fp32
  gradients before its reduce-scatter;
- activations come on top and depend on ``micro_batch_tokens`` (not estimated);
- at start-up rank 0 also holds the checkpoint once in host memory (its own dtype).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

__all__ = ["TrainerMemory", "estimate", "memory_line"]

GIB = 1 << 30


class TrainerMemory(msgspec.Struct, frozen=True, kw_only=True):
    params: int  # parameters (tied weights once)
    ranks: int  # FSDP2 ranks
    state_gib: float  # sharded fp32 weights + grads + AdamW moments per rank
    unsharded_gib: float  # root + ~2 blocks in the compute dtype + one block of fp32 grads
    host_gib: float  # rank 0's host copy of the checkpoint at start-up


def _counts(model_dir: Path) -> tuple[int, int, int]:
    """(all params, largest decoder block, root params) of a meta-device model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from spade_async.trainer.model import decoder_layers

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in decoder_layers(model)]
    return total, max(blocks, default=0), total - sum(blocks)


def estimate(
    model_dir: str | Path, ranks: int, *, mixed_precision: bool, on_gpu: bool
) -> TrainerMemory | None:
    """None when the model's config.json is not on this machine."""
    model_dir = Path(model_dir)
    cfg_file = model_dir / "config.json"
    if not cfg_file.is_file():
        return None
    total, block, root = _counts(model_dir)
    compute = 2 if mixed_precision and on_gpu else 4
    raw = json.loads(cfg_file.read_text())
    ckpt = 2 if str(raw.get("torch_dtype") or raw.get("dtype")) in ("bfloat16", "float16") else 4
    ranks = max(1, ranks)
    return TrainerMemory(
        params=total,
        ranks=ranks,
        state_gib=16 * total / ranks / GIB,
        unsharded_gib=(compute * (root + 2 * block) + 4 * block) / GIB,
        host_gib=ckpt * total / GIB,
    )


def memory_line(model_dir: str | Path, ranks: int, *, mixed_precision: bool, on_gpu: bool) -> str:
    m = estimate(model_dir, ranks, mixed_precision=mixed_precision, on_gpu=on_gpu)
    where = "GPU" if on_gpu else "CPU rank"
    if m is None:
        return (
            f"trainer memory per {where}: unknown here (no config.json in '{model_dir}'); "
            f"16 B/param over {max(1, ranks)} rank(s) + unsharded blocks + activations"
        )
    return (
        f"trainer memory per {where}: ~{m.state_gib + m.unsharded_gib:.1f} GiB before "
        f"activations ({m.params / 1e9:.2f}B params: {m.state_gib:.1f} GiB sharded fp32 "
        f"weights+grads+AdamW over {m.ranks} rank(s), {m.unsharded_gib:.1f} GiB unsharded "
        f"root + ~2 blocks; no rank holds more than its 1/{m.ranks} of the fp32 model); "
        f"rank 0 reads the checkpoint into "
        f"{m.host_gib:.1f} GiB of host memory at start-up"
    )
