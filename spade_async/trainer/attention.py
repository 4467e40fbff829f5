"""Varlen attention for packed rows without flash-attn: SDPA run per packed sequence.

transformers' sdpa path turns reset position ids into a block-diagonal [T, T] mask, which
is correct but computes every cross-sequence score and then throws it away (cost ~T^2 per
packed row instead of sum(L_i^2)). This attention function, registered with transformers'
``AttentionInterface`` as ``spade_varlen_sdpa``, reads the same ``cu_seq_lens_q`` kwargs
that flash_attention_2 uses for varlen and runs causal SDPA on each sequence's slice.
Without ``cu_seq_lens_q`` (padded rows) it is plain causal SDPA: with right padding every
real token sees exactly its own prefix, and pad positions are never trained.

Registration is this module's only side effect (a name in transformers' global registry).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["NAME", "varlen_sdpa"]

NAME = "spade_varlen_sdpa"
_VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def varlen_sdpa(module, query, key, value, attention_mask, **kwargs):
    """query [B, H, T, d] -> ([B, T, H, d], None), causal within each packed sequence."""
    cu = kwargs.get("cu_seq_lens_q")
    rest = {k: v for k, v in kwargs.items() if k not in _VARLEN_KEYS}
    rest.pop("is_causal", None)
    if cu is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **rest)
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


AttentionInterface.register(NAME, varlen_sdpa)
