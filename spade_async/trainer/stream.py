"""The trainer's weights as the engine wants them: in its dtype, one bucket at a time.

Every push path reads the policy through ``bucketed``: the buckets are planned from the
parameters' global shapes (meta tensors, nothing gathered), then each bucket is cast to the
engine's dtype *on the shard* and only then all-gathered (FSDP2 ``full_tensor``). So no
rank ever holds an fp32 copy of the whole model: at most one bucket of full tensors in the
engine's dtype, which also halves the all-gather traffic for bf16 engines.

``export_safetensors`` streams the same buckets into a Hugging Face directory for the disk
path: one ``model.safetensors`` when the model fits one shard (what the CPU engine's fast
reload reads), else ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
(what SGLang and transformers read).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from spade_async.trainer.push_common import (
    PREFIX,
    TOKENIZER_FILES,
    barrier,
    base_name,
    lora_pairs,
    replace_dir,
)

__all__ = [
    "engine_dtype",
    "plan",
    "buckets",
    "bucketed",
    "export_safetensors",
    "DISK_SHARD_BYTES",
]

DISK_SHARD_BYTES = 4 << 30  # HF-sized shards for the disk path (one bucket in RAM at a time)


def engine_dtype(
    model_dir: str | Path, requested: str = "", *, sglang_auto: bool = True
) -> torch.dtype:
    """``requested`` (e.g. 'bfloat16'), else the checkpoint's config dtype; with
    ``sglang_auto`` (tensors sent straight into SGLang's parameters) what ``--dtype auto``
    serves: float32 checkpoints in float16 (bfloat16 for Gemma), as
    ``sglang.srt.configs.model_config._get_and_verify_dtype`` decides. Files on disk keep
    the checkpoint's dtype (every engine casts them on load)."""
    if requested and requested != "auto":
        dtype = getattr(torch, requested, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"engine dtype {requested!r} is not a torch dtype (e.g. bfloat16)")
        return dtype
    cfg_file = Path(model_dir) / "config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").removeprefix("torch.")
    dtype = getattr(torch, name, torch.float32)
    if dtype == torch.float32 and sglang_auto:
        gemma = str(cfg.get("model_type", "")).startswith("gemma")
        return torch.bfloat16 if gemma else torch.float16
    return dtype


def plan(trainer, dtype: torch.dtype) -> list[tuple[str, torch.nn.Parameter, torch.Tensor]]:
    """(HF name, parameter, meta tensor of its full shape in ``dtype``), tied lm_head left out.
    With LoRA the adapted weights keep their HF names (merged in ``bucketed``) and the
    adapters themselves are not listed."""
    tied = getattr(trainer.model.causal_lm.config, "tie_word_embeddings", False)
    out = []
    for name, p in trainer.model.named_parameters():
        hf = name.removeprefix(PREFIX)
        if ".lora_A." in hf or ".lora_B." in hf:
            continue
        hf = base_name(hf)
        if tied and hf == "lm_head.weight":
            continue
        out.append((hf, p, torch.empty(p.shape, dtype=dtype, device="meta")))
    return out


def _merged(trainer, hf: str, dtype: torch.dtype, pairs: dict, named: dict) -> torch.Tensor:
    """W + (alpha / r) B A of an adapted weight, computed in fp32 from the gathered full
    tensors (one module's at a time), then cast."""
    a_name, b_name = pairs[hf]
    lora = trainer.cfg.lora
    dev = trainer.device if trainer.cfg.offload == "optimizer" else None
    w = _on(_full(named[hf.removesuffix(".weight") + ".base_layer.weight"], torch.float32), dev)
    a = _on(_full(named[a_name], torch.float32), dev)
    b = _on(_full(named[b_name], torch.float32), dev)
    return (w + (lora.alpha / lora.rank) * (b @ a)).to(dtype)


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int):
    """Consecutive groups of (name, tensor) of at most ``bucket_bytes`` (a larger tensor
    gets a bucket of its own); sizes from numel * element_size, so meta tensors plan."""
    bucket, size = [], 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def _full(p: torch.nn.Parameter, dtype: torch.dtype) -> torch.Tensor:
    """The whole parameter in ``dtype``: cast the local shard first, then all-gather it."""
    t = p.detach().to(dtype)
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """With optimizer offload the shards live on the host (gathered over gloo): the full
    tensor moves to the trainer's device, where the NCCL/IPC pushes need it."""
    return t if device is None or t.device == device else t.to(device)


def bucketed(
    trainer, dtype: torch.dtype, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of (HF name, full tensor in ``dtype``) on every rank (each rank must iterate:
    the all-gathers are collective). One bucket exists at a time."""
    items = plan(trainer, dtype)
    params = {name: p for name, p, _ in items}
    pairs, named = {}, {}
    if getattr(getattr(trainer, "cfg", None), "lora", None) is not None:
        named = {n.removeprefix(PREFIX): p for n, p in trainer.model.named_parameters()}
        pairs = lora_pairs(named)
    # offloaded shards are gathered on the host: move the full tensors to the device
    offload = getattr(getattr(trainer, "cfg", None), "offload", "none") == "optimizer"
    device = trainer.device if offload else None
    for chunk in buckets(((name, meta) for name, _, meta in items), bucket_bytes):
        yield [
            (name, _merged(trainer, name, dtype, pairs, named))
            if name in pairs
            else (name, _on(_full(params[name], dtype), device))
            for name, _ in chunk
        ]


def export_safetensors(trainer, target: Path, dtype: torch.dtype, shard_bytes: int) -> Path:
    """Every rank calls this; rank 0 writes ``target`` atomically, one shard in memory at a time."""
    from safetensors.torch import save_file

    items = plan(trainer, dtype)
    n = sum(1 for _ in buckets(((name, meta) for name, _, meta in items), shard_bytes))
    tmp = None
    if trainer.rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        weight_map, total = {}, 0
        for i, chunk in enumerate(bucketed(trainer, dtype, shard_bytes), start=1):
            if tmp is None:
                continue
            file = "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
            tensors = {k: v.to("cpu").contiguous() for k, v in chunk}
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            total += sum(v.numel() * v.element_size() for v in tensors.values())
            weight_map.update({k: file for k in tensors})
            del tensors
        if tmp is not None:
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": weight_map}
                (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
            config = trainer.model.causal_lm.config
            config.save_pretrained(tmp)
            meta = json.loads((tmp / "config.json").read_text())
            meta["torch_dtype"] = meta["dtype"] = str(dtype).removeprefix("torch.")
            (tmp / "config.json").write_text(json.dumps(meta, indent=2))
            for name in TOKENIZER_FILES:
                src = trainer.model_dir / name
                if src.is_file():
                    shutil.copy2(src, tmp / name)
            (tmp / "spade_version.json").write_text(json.dumps({"version": trainer.version}))
            replace_dir(tmp, target)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier()
    return target
