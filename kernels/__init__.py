"""spade_kernels: fused log-prob/entropy and policy loss (torch reference, chunked CPU, Triton).

Public API:
    linear_logprob(hidden_TD, weight_VD, target_T, *, temperature=1.0, return_entropy=False)
    policy_loss(logprob_T, old_logprob_T, advantage_T, mask_T, ...)  (see loss.py)
    reference.linear_logprob_ref(...)  plain-torch ground truth

This package never imports spade_async.
"""

from __future__ import annotations

from . import reference
from .dispatch import linear_logprob, triton_available
from .loss import AGGREGATIONS, policy_loss

__all__ = ["AGGREGATIONS", "linear_logprob", "policy_loss", "reference", "triton_available"]
