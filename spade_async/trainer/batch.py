"""Training batch messages and their validation (run on rank 0 before any rank steps).

Token convention: ``rollout_logprobs[i]`` is the engine's log-prob of ``token_ids[i]`` given
``token_ids[:i]`` under ``log_softmax(logits / temperature)``; ``loss_mask[i] == 1`` marks a
token the policy generated and is trained on. Token 0 has no prefix, so its mask must be 0
(that is also what keeps packed sequences from learning across their boundaries).
"""

from __future__ import annotations

import math

import msgspec

from spade_async.errors import SpadeError

__all__ = ["Sample", "Batch", "BatchError", "loss_units", "validate_batch"]


class BatchError(SpadeError):
    """A batch the trainer refuses; the message names the sample index and the reason."""


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    rollout_logprobs: list[float]
    role: str = "agent"
    policy_version: int = 0
    # Samples sharing a loss_group >= 0 are one episode's turn samples (thinking fan-out):
    # a sample-mean loss takes one token mean over all of them and counts them once (slime's
    # group_id / group_mask_sums); -1: the sample is a unit of its own.
    loss_group: int = -1
    # routing replay (trainer/routing.py): the engine's top-k experts of token p in row p,
    # [rows, layers, top_k] compact (generation/routed_experts.py); b"": none, no replay
    routed_experts: bytes = b""


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    samples: list[Sample]
    # The unit count (samples; an episode's loss_group counts once) a sample-mean loss
    # (loss_agg 'seq-mean-*') divides by; 0 = the batch's own count. Larger when units count
    # that train nothing (the reference's zero-mask compact-filtered samples, or its global
    # batch when a short batch is not rescaled). 'token' adds one loss token per such unit
    # (slime counts max(n, 1) loss tokens per sample).
    loss_normaliser: float = 0.0


def loss_units(samples: list[Sample]) -> list[int]:
    """Each sample's unit index in [0, U): samples of one loss_group share theirs."""
    units: dict[tuple[int, int], int] = {}
    return [
        units.setdefault((1, s.loss_group) if s.loss_group >= 0 else (0, i), len(units))
        for i, s in enumerate(samples)
    ]


def _sample_problem(s: Sample, vocab_size: int) -> str | None:
    n = len(s.token_ids)
    if n < 2:
        return f"has {n} token(s); a sample needs a prompt token and at least one trained token"
    if len(s.loss_mask) != n:
        return f"loss_mask has {len(s.loss_mask)} entries but token_ids has {n}"
    if len(s.rollout_logprobs) != n:
        return f"rollout_logprobs has {len(s.rollout_logprobs)} entries but token_ids has {n}"
    if not math.isfinite(s.advantage):
        return f"advantage is {s.advantage} (must be finite)"
    bad_mask = next((m for m in s.loss_mask if m not in (0, 1)), None)
    if bad_mask is not None:
        return f"loss_mask holds {bad_mask} (only 0 and 1 are allowed)"
    if s.loss_mask[0] != 0:
        return "loss_mask[0] is 1 but the first token has no prefix to predict it from"
    if not any(s.loss_mask):
        return "loss_mask is all zeros (no token to train on)"
    lo, hi = min(s.token_ids), max(s.token_ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        return f"token id {bad} is outside the vocabulary [0, {vocab_size})"
    for i, (m, lp) in enumerate(zip(s.loss_mask, s.rollout_logprobs, strict=True)):
        if m and not (math.isfinite(lp) and lp <= 0.0):
            return f"rollout_logprobs[{i}] = {lp} on a trained token (must be finite and <= 0)"
    return None


def validate_batch(batch: Batch, vocab_size: int) -> None:
    """Raise BatchError('sample 3: ...') for the first bad sample; an empty batch is bad too."""
    if not batch.samples:
        raise BatchError("batch has no samples; send at least one")
    n = batch.loss_normaliser
    units = len(set(loss_units(batch.samples)))
    if n != 0.0 and not (math.isfinite(n) and n >= units):
        raise BatchError(
            f"loss_normaliser {n} is below the batch's {units} samples (an episode's "
            "loss_group counts once) or not finite; send 0 for the batch's own count"
        )
    for index, sample in enumerate(batch.samples):
        problem = _sample_problem(sample, vocab_size)
        if problem is not None:
            raise BatchError(f"sample {index} ({sample.role}): {problem}")
