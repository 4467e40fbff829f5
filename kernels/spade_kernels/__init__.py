"""spade_kernels: fused log-prob/entropy and policy loss (torch reference, chunked CPU, Triton).

Shape legend: T tokens, D hidden size, V vocabulary size.

Public API:
    linear_logprob(hidden_TD, weight_VD, target_T, *, temperature=1.0, return_entropy=False)
    policy_loss(logprob_T, old_logprob_T, advantage_T, mask_T, ...)  (see loss.py)
    policy_head(hidden_TD, weight_VD, target_T, PolicyTerms(...))  loss + gradient in one
        pass over the vocabulary (head.py); loss_weights(...) gives its per-token weights
    reference.linear_logprob_ref(...)  plain-torch ground truth

This package never imports spade_async.
"""

from __future__ import annotations

from . import reference
from .dispatch import linear_logprob, policy_head, triton_available
from .head import HeadOut, PolicyTerms
from .loss import AGGREGATIONS, loss_weights, policy_loss

__all__ = [
    "AGGREGATIONS",
    "HeadOut",
    "PolicyTerms",
    "linear_logprob",
    "loss_weights",
    "policy_head",
    "policy_loss",
    "reference",
    "triton_available",
]
