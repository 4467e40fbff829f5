"""Activation checkpointing of the decoder blocks: full, selective or none.

- ``full``: every decoder block keeps only its input; backward recomputes the whole block
  (attention and MLP GEMMs included: ~1/3 more model flops).
- ``selective``: every block is checkpointed, but the outputs of its expensive ops (matrix
  products, attention kernels) are saved during the forward (torch's selective activation
  checkpointing, ``create_selective_checkpoint_contexts``); backward recomputes only the
  cheap ops between them (norms, RoPE, SiLU-and-multiply, residual adds, casts). The
  memory saved is what those pointwise ops would hold; no GEMM runs twice.
- ``none``: nothing recomputed.

``true`` / ``false`` in a recipe mean ``full`` / ``none`` (the field used to be a bool).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["MODES", "apply", "mode_of", "saved_ops"]

MODES = ("full", "selective", "none")


def mode_of(value: str | bool) -> str:
    if value is True:
        return "full"
    if value is False:
        return "none"
    if value not in MODES:
        raise ValueError(f"activation_checkpointing={value!r} is not one of {MODES}")
    return value


@functools.cache
def saved_ops() -> frozenset:
    """The aten ops whose outputs selective checkpointing keeps (those present in this torch)."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    )
    ops = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    return frozenset(ops)


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    if op in saved_ops():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def apply(causal_lm: nn.Module, value: str | bool) -> str:
    """Enable the mode on a transformers model (before FSDP wraps it); returns the mode."""
    mode = mode_of(value)
    if mode == "none":
        return mode
    kwargs = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = _selective_context
    if hasattr(causal_lm, "activation_checkpointing_enable"):
        causal_lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers before the rename
        causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return mode
