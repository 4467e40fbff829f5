"""The dry run's routing-replay line: what the routes cost (``trainer.routing_replay``).

A sample carries tokens x MoE layers x top-k expert ids, compact (1 byte each up to 256
experts, else 2: ``generation/routed_experts.py``) from the engine through the batch to the
trainer, which keeps a whole step's on the host; a micro-batch's go to the device as int64
indices (8 bytes each: what the router hook gathers with, ``trainer/routing.py``).
"""

from __future__ import annotations

from spade_async.generation.routed_experts import RouteShape

__all__ = ["route_bytes", "routes_line"]

INDEX_BYTES = 8  # int64 ids on the device (torch.gather's index)


def route_bytes(shape: RouteShape, tokens: int, *, itemsize: int | None = None) -> int:
    """tokens x layers x top-k x bytes per id (the compact size unless ``itemsize``)."""
    size = shape.dtype.itemsize if itemsize is None else itemsize
    return tokens * shape.layers * shape.topk * size


def routes_line(shape: RouteShape, row_tokens: int, sample_tokens: int, batch_samples: int) -> str:
    micro = route_bytes(shape, row_tokens, itemsize=INDEX_BYTES)
    one = route_bytes(shape, sample_tokens)
    per = f"{shape.layers} MoE layers x top-{shape.topk} x {shape.dtype.itemsize} B"
    if batch_samples:
        step = (
            f"{batch_samples} samples of up to {sample_tokens} tokens: {_mb(one * batch_samples)}"
        )
    else:
        step = f"{_mb(one)} per sample of {sample_tokens} tokens (batch_samples = 0: all)"
    return (
        f"  routing replay routes ({per} per token): per micro-batch of {row_tokens} tokens "
        f"{_mb(micro)} on the device (int64 ids); per step {step} on the host and the wire"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"
