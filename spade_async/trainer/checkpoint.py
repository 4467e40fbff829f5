"""Sharded checkpoints (torch.distributed.checkpoint) and Hugging Face safetensors export.

A checkpoint directory holds the DCP shards of model + optimizer (every rank writes its
own), ``trainer.json`` (step, version, skipped steps, scheduler state, every parameter's
full shape) from rank 0, and ``rng-rank{R}.pt`` per rank. ``load_checkpoint`` compares
shapes first, so a checkpoint of another model is one clear error, not a DCP traceback.

``export_hf`` streams the weights bucket by bucket in the checkpoint's dtype (as pushes do,
trainer/stream.py) into ``model.safetensors`` (or HF-sized shards + index) + config +
tokenizer files: a directory transformers, SGLang and the CPU engine load. With
``trainer.lora`` that directory is the merged model (W + (alpha / r) B A) and its
``adapter/`` subdirectory the adapter alone, in peft's format (trainer/lora.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from spade_async.errors import SpadeError
from spade_async.trainer.push_common import PREFIX, barrier, is_dist

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "export_hf"]


class CheckpointError(SpadeError):
    """A checkpoint that cannot be loaded into this trainer (missing, or another model)."""


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns when used without a process group; in one process that is what we mean."""
    with warnings.catch_warnings():
        if not is_dist():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in model.named_parameters()}  # DTensor: global shape


def save_checkpoint(trainer, directory: str | Path) -> Path:
    """Every rank calls this; returns the directory."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    with _single_process_ok():
        dcp.save(
            {"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), no_dist=not is_dist()
        )
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / f"rng-rank{trainer.rank}.pt")
    if trainer.rank == 0:
        meta = {
            "step": trainer.step,
            "version": trainer.version,
            "skipped_steps": trainer.skipped_steps,
            "world_size": trainer.world,
            "scheduler": trainer.scheduler.state_dict(),
            "shapes": _shapes(trainer.model),
        }
        tmp = path / "trainer.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path / "trainer.json")
    barrier()
    return path


def _check_shapes(saved: dict[str, list[int]], current: dict[str, list[int]], path: Path) -> None:
    for name, shape in current.items():
        if name not in saved:
            raise CheckpointError(
                f"checkpoint '{path}' has no parameter '{name.removeprefix(PREFIX)}': it was saved "
                "from another model; set trainer.model to that model or start without --load"
            )
        if saved[name] != shape:
            raise CheckpointError(
                f"checkpoint '{path}' holds '{name.removeprefix(PREFIX)}' of shape {saved[name]} but "
                f"this model's is {shape}: it was saved from another model shape; set "
                "trainer.model to the model it was trained from"
            )
    extra = sorted(set(saved) - set(current))
    if extra:
        raise CheckpointError(
            f"checkpoint '{path}' has parameters this model lacks ({extra[0].removeprefix(PREFIX)}"
            f", {len(extra)} in all): it was saved from another model"
        )


def load_checkpoint(trainer, directory: str | Path) -> dict:
    """Every rank calls this; restores model, optimizer, schedule, counters and RNG."""
    path = Path(directory)
    meta_file = path / "trainer.json"
    if not meta_file.is_file():
        raise CheckpointError(f"'{path}' is not a trainer checkpoint (no trainer.json)")
    meta = json.loads(meta_file.read_text())
    _check_shapes(meta["shapes"], _shapes(trainer.model), path)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path), no_dist=not is_dist())
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )
    trainer.scheduler.load_state_dict(meta["scheduler"])
    trainer.step, trainer.version = meta["step"], meta["version"]
    trainer.skipped_steps = meta["skipped_steps"]
    rng_file = path / f"rng-rank{trainer.rank}.pt"
    if rng_file.is_file():  # a different world size keeps fresh RNG on the new ranks
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    barrier()
    return meta


def export_hf(trainer, directory: str | Path, *, shard_bytes: int = 0) -> Path:
    """Every rank calls this; rank 0 writes the directory atomically (temp dir + rename).

    Streamed like a weight push (trainer/stream.py): bucket by bucket, each cast to the
    export dtype (the checkpoint's own, from its config.json) on the shard before it is
    gathered, one ``shard_bytes`` safetensors file in memory at a time (default
    ``stream.DISK_SHARD_BYTES``). No process ever holds a full fp32 copy of the model."""
    from spade_async.trainer import stream  # stream imports this module

    dtype = stream.engine_dtype(trainer.model_dir, sglang_auto=False)
    out = stream.export_safetensors(
        trainer, Path(directory), dtype, shard_bytes or stream.DISK_SHARD_BYTES
    )
    if getattr(getattr(trainer, "cfg", None), "lora", None) is not None:  # + the adapter alone
        from spade_async.trainer.lora import export_adapter

        export_adapter(trainer, out / "adapter", dtype)
    return out
