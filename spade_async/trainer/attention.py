"""Varlen attention for packed rows without the flash-attn package.

Two attention functions, registered with transformers' ``AttentionInterface`` (their
registration is this module's only side effect: names in transformers' global registry).
Both read the ``cu_seq_lens_q`` kwargs that flash_attention_2 uses for varlen; without them
(padded rows) both are plain causal SDPA: with right padding every real token sees exactly
its own prefix, and pad positions are never trained.

- ``spade_varlen`` (CUDA default without flash-attn): torch's built-in variable-length
  FlashAttention, ``torch.nn.attention.varlen.varlen_attn``, one kernel over the packed row
  (bf16/fp16, sm80+). Its signature moved between torch releases: causal masking is
  ``window_size=(-1, 0)`` on newer ones, ``is_causal=True`` on older; grouped-query KV heads
  go in as they are where it takes ``enable_gqa``, else they are repeated to the query
  heads. Other dtypes fall back to the per-sequence path, and so does a module whose
  softmax scale is not 1/sqrt(head_dim) on a torch whose varlen_attn takes no ``scale``.
- ``spade_varlen_sdpa`` (CPU): causal SDPA per packed sequence (transformers' sdpa path
  would build a block-diagonal [T, T] mask and compute every cross-sequence score). The
  sequence bounds are Python ints, handed in once per micro-batch as ``spade_seq_bounds``
  (PolicyModel.forward computes them from the CPU-side cu_seqlens), so no layer reads a
  device tensor back to the host; without them it falls back to ``cu.tolist()``.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["BOUNDS_KEY", "NAME", "VARLEN", "torch_varlen_available", "varlen_sdpa", "varlen_torch"]

NAME = "spade_varlen_sdpa"
VARLEN = "spade_varlen"
BOUNDS_KEY = "spade_seq_bounds"
_VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", BOUNDS_KEY)


def _rest(kwargs: dict) -> dict:
    rest = {k: v for k, v in kwargs.items() if k not in _VARLEN_KEYS}
    rest.pop("is_causal", None)
    return rest


def varlen_sdpa(module, query, key, value, attention_mask, **kwargs):
    """query [B, H, T, d] -> ([B, T, H, d], None), causal within each packed sequence."""
    cu = kwargs.get("cu_seq_lens_q")
    rest = _rest(kwargs)
    if cu is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **rest)
    bounds = kwargs.get(BOUNDS_KEY)
    if bounds is None:
        bounds = cu.tolist() if isinstance(cu, torch.Tensor) else list(cu)
    outs = [
        sdpa_attention_forward(
            module,
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            None,
            is_causal=True,
            **rest,
        )[0]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        if b > a
    ]
    return torch.cat(outs, dim=1), None


@functools.cache
def _varlen_fn():
    """(varlen_attn, its parameter names) or None when this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def torch_varlen_available() -> bool:
    return _varlen_fn() is not None


def varlen_call_kwargs(params: frozenset, n_q_heads: int, n_kv_heads: int) -> tuple[dict, bool]:
    """(causal/GQA keyword arguments for this torch's varlen_attn, repeat KV heads?)."""
    kw = {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0)
    elif "is_causal" in params:
        kw["is_causal"] = True
    else:
        raise RuntimeError("torch's varlen_attn takes neither window_size nor is_causal")
    repeat = n_q_heads != n_kv_heads
    if repeat and "enable_gqa" in params:
        kw["enable_gqa"], repeat = True, False
    return kw, repeat


def varlen_scale_ok(params: frozenset, scale: float | None, head_dim: int) -> bool:
    """Whether this torch's varlen_attn applies ``scale``: the older signature (positional
    ``is_causal``, no ``scale``) always uses 1/sqrt(head_dim)."""
    if scale is None or "scale" in params:
        return True
    return abs(scale - head_dim**-0.5) <= 1e-6 * head_dim**-0.5


def varlen_torch(module, query, key, value, attention_mask, **kwargs):
    """query [1, H, T, d] -> ([1, T, H, d], None) through torch's varlen FlashAttention."""
    cu = kwargs.get("cu_seq_lens_q")
    fn = _varlen_fn()
    if (
        cu is None
        or query.shape[0] != 1
        or fn is None
        or not query.is_cuda
        or query.dtype not in (torch.bfloat16, torch.float16)
    ):
        return varlen_sdpa(module, query, key, value, attention_mask, **kwargs)
    varlen_attn, params = fn
    scale = kwargs.get("scaling", getattr(module, "scaling", None))
    if not varlen_scale_ok(params, scale, query.shape[-1]):
        return varlen_sdpa(module, query, key, value, attention_mask, **kwargs)
    q = query[0].transpose(0, 1)  # [T, H, d]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    kw, repeat = varlen_call_kwargs(params, q.shape[1], k.shape[1])
    if repeat:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if scale is not None and "scale" in params:
        kw["scale"] = scale
    cu = cu.to(torch.int32)
    max_len = int(kwargs.get("max_length_q") or 0) or q.shape[0]
    out = varlen_attn(
        q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, max_len, max_len, **kw
    )
    return out.unsqueeze(0), None


AttentionInterface.register(NAME, varlen_sdpa)
AttentionInterface.register(VARLEN, varlen_torch)
