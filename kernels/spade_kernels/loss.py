"""Policy loss: PPO/GRPO clipped surrogate with asymmetric clipping, TIS, low_var_kl, entropy.

Shape legend: T tokens (a flat packed batch, or [B, L] where each row is one sequence),
S sequences (bins indexed by seq_ids_T; S <= T).

Per token (all terms masked by mask_T):
    ratio_T = exp(logprob - old_logprob)
    pg_T    = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    tis_T   = min(exp(base - rollout_logprob), tis_cap), detached            (if rollout given)
              base = old_logprob, or with tis_current the current logprob (slime's
              --use-rollout-logprobs --use-tis: the ratio is against the rollout, the weight
              compares the trainer's own log-prob with it; slime vanilla_tis_function)
    kl_T    = clamp(exp(ref - logprob) - (ref - logprob) - 1, -10, 10)      (if ref given)
              slime's low_var_kl (ppo_utils.compute_approx_kl): k3 clamped to [-10, 10],
              value and gradient (0 outside; k3 >= 0, so only the upper edge bites: where
              ref - logprob > ~2.61 or < ~-11.0)
    loss_T  = tis_T * pg_T + kl_coef * kl_T - entropy_coef * entropy_T

Aggregation (`agg`), with `loss_scale_denominator` the caller's GLOBAL count so that the
loss and its gradient are the same however a batch is split into micro-batches:
    "token":               sum_T mask * loss_T / denominator   (denominator: loss tokens)
    "seq-mean-token-mean": sum_S (sum_{t in s} mask*loss / n_s) / denominator  (sequences)
    "seq-mean-token-sum":  sum_S (sum_{t in s} mask*loss) / denominator        (sequences)
Without a denominator the local count is used (this call's loss tokens, or sequences with at
least one loss token). For sequence aggregation each sequence must sit whole in one call,
unless ``seq_tokens_T`` gives n_s per token from the whole batch: a "sequence" is then any
unit of the mean, e.g. an episode whose turns are several samples (slime's group_mask_sums:
one token mean per group).

Pure functions: no .item(), no host sync; metrics are detached 0-d tensors. Metrics are
means over this call's loss tokens; combine micro-batches weighted by metrics["tokens"].
"""

from __future__ import annotations

import torch

__all__ = ["AGGREGATIONS", "LOW_VAR_KL_CLAMP", "loss_weights", "low_var_kl", "policy_loss"]

AGGREGATIONS = ("token", "seq-mean-token-mean", "seq-mean-token-sum")
LOW_VAR_KL_CLAMP = 10.0  # slime ppo_utils.compute_approx_kl: clamp(kl, min=-10, max=10)


def low_var_kl(d_T: torch.Tensor) -> torch.Tensor:
    """slime's low_var_kl of d = ref - logprob: k3 = exp(d) - d - 1 clamped to [-10, 10]
    (torch.clamp: gradient 1 - exp(d) inside the closed interval, 0 outside)."""
    return (d_T.exp() - d_T - 1.0).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


def _seq_ids(
    shape: torch.Size, device, seq_ids_T: torch.Tensor | None, cu_seqlens: torch.Tensor | None
) -> torch.Tensor:
    """Per-token sequence index in [0, T) for the flattened batch."""
    if seq_ids_T is not None and cu_seqlens is not None:
        raise ValueError("pass seq_ids_T or cu_seqlens, not both")
    if seq_ids_T is not None:
        if seq_ids_T.shape != shape:
            raise ValueError(f"seq_ids_T shape {tuple(seq_ids_T.shape)} != {tuple(shape)}")
        return seq_ids_T.reshape(-1).long()
    if cu_seqlens is not None:
        if len(shape) != 1:
            raise ValueError(f"cu_seqlens needs flat [T] inputs, got shape {tuple(shape)}")
        lengths_S = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        ids_S = torch.arange(lengths_S.numel(), device=device)
        return torch.repeat_interleave(ids_S, lengths_S, output_size=shape[0])
    if len(shape) == 2:  # [B, L]: one sequence per row
        return torch.arange(shape[0], device=device).repeat_interleave(shape[1])
    raise ValueError(
        "sequence-level agg needs seq_ids_T or cu_seqlens for flat [T] inputs (or [B, L] rows)"
    )


def loss_weights(
    mask_T: torch.Tensor,
    agg: str,
    *,
    seq_ids_T: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    loss_scale_denominator: float | torch.Tensor | None = None,
    seq_tokens_T: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights w (flat [T], fp32; fp64 for an fp64 mask) with
    ``policy_loss(...) == sum_t w_t * loss_t`` for every ``agg``: mask / denominator
    ("token", "seq-mean-token-sum") or mask / (n_s * denominator) ("seq-mean-token-mean",
    n_s the loss tokens of the token's sequence, or ``seq_tokens_T`` when given: the
    whole batch's count for the token's unit). Same denominators as policy_loss."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg={agg!r} is not one of {AGGREGATIONS}")
    mask = mask_T.to(torch.promote_types(mask_T.dtype, torch.float32))
    flat = mask.reshape(-1)
    if agg == "token":
        denom = (
            flat.sum().clamp(min=1) if loss_scale_denominator is None else loss_scale_denominator
        )
        return flat / denom
    if seq_tokens_T is not None and loss_scale_denominator is not None:
        if agg == "seq-mean-token-sum":
            return flat / loss_scale_denominator
        n_T = seq_tokens_T.reshape(-1).to(flat.dtype).clamp(min=1)
        return flat / (n_T * loss_scale_denominator)
    ids = _seq_ids(mask_T.shape, mask.device, seq_ids_T, cu_seqlens)
    seq_n_S = flat.new_zeros(flat.numel()).index_add_(0, ids, flat)
    if loss_scale_denominator is None:
        denom = (seq_n_S > 0).sum().clamp(min=1)
    else:
        denom = loss_scale_denominator
    if agg == "seq-mean-token-mean":
        return flat / (seq_n_S.clamp(min=1)[ids] * denom)
    return flat / denom


def _masked_mean(x_T: torch.Tensor, mask_T: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return ((x_T * mask_T).sum() / n.clamp(min=1)).detach()


def policy_loss(
    logprob_T: torch.Tensor,
    old_logprob_T: torch.Tensor,
    advantage_T: torch.Tensor,
    mask_T: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token",
    rollout_logprob_T: torch.Tensor | None = None,
    tis_cap: float = 2.0,
    ref_logprob_T: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy_T: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    seq_ids_T: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    loss_scale_denominator: float | torch.Tensor | None = None,
    seq_tokens_T: torch.Tensor | None = None,
    tis_current: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss (scalar) and detached metrics; see the module docstring."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg={agg!r} is not one of {AGGREGATIONS}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low={clip_low}, clip_high={clip_high} must both be >= 0")
    if not tis_cap > 0:
        raise ValueError(f"tis_cap={tis_cap} must be > 0")
    shape = logprob_T.shape
    named = {
        "old_logprob_T": old_logprob_T,
        "advantage_T": advantage_T,
        "mask_T": mask_T,
        "rollout_logprob_T": rollout_logprob_T,
        "ref_logprob_T": ref_logprob_T,
        "entropy_T": entropy_T,
        "seq_tokens_T": seq_tokens_T,
    }
    for name, t in named.items():
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprob_T shape {tuple(shape)}")
    if kl_coef and ref_logprob_T is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprob_T")
    if seq_tokens_T is not None and loss_scale_denominator is None:
        raise ValueError("seq_tokens_T (whole-batch unit counts) needs loss_scale_denominator")
    if entropy_coef and entropy_T is None:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy_T (return_entropy=True)")

    acc = torch.promote_types(logprob_T.dtype, torch.float32)  # fp32 math; fp64 stays fp64
    logprob = logprob_T.to(acc)
    mask = mask_T.to(logprob.dtype)
    adv = advantage_T.to(logprob.dtype)
    n_tok = mask.sum()

    log_ratio = logprob - old_logprob_T.to(acc)
    ratio = log_ratio.exp()
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    loss_tok = pg
    metrics: dict[str, torch.Tensor] = {"tokens": n_tok.detach()}
    with torch.no_grad():
        metrics["pg_loss"] = _masked_mean(pg, mask, n_tok)
        metrics["ratio_mean"] = _masked_mean(ratio, mask, n_tok)
        metrics["clip_frac"] = _masked_mean((pg2 > pg1).float(), mask, n_tok)
        metrics["clip_low_frac"] = _masked_mean(
            ((ratio < 1.0 - clip_low) & (adv < 0)).float(), mask, n_tok
        )
        metrics["clip_high_frac"] = _masked_mean(
            ((ratio > 1.0 + clip_high) & (adv > 0)).float(), mask, n_tok
        )
    if rollout_logprob_T is not None:
        base = logprob.detach() if tis_current else old_logprob_T.to(acc)
        tis = (base - rollout_logprob_T.to(acc)).exp().clamp(max=tis_cap).detach()
        loss_tok = loss_tok * tis
        metrics["tis_mean"] = _masked_mean(tis, mask, n_tok)
        metrics["tis_capped_frac"] = _masked_mean((tis >= tis_cap).float(), mask, n_tok)
    if ref_logprob_T is not None:
        kl = low_var_kl(ref_logprob_T.to(acc) - logprob)
        metrics["kl"] = _masked_mean(kl, mask, n_tok)
        if kl_coef:
            loss_tok = loss_tok + kl_coef * kl
    if entropy_T is not None:
        metrics["entropy"] = _masked_mean(entropy_T.to(acc), mask, n_tok)
        if entropy_coef:
            loss_tok = loss_tok - entropy_coef * entropy_T.to(acc)

    masked = (loss_tok * mask).reshape(-1)
    if agg == "token":
        denom = n_tok.clamp(min=1) if loss_scale_denominator is None else loss_scale_denominator
        loss = masked.sum() / denom
    elif seq_tokens_T is not None:  # units spanning calls: whole-batch counts
        w = loss_weights(
            mask, agg, loss_scale_denominator=loss_scale_denominator, seq_tokens_T=seq_tokens_T
        )
        loss = (loss_tok.reshape(-1) * w).sum()
    else:
        ids = _seq_ids(shape, logprob.device, seq_ids_T, cu_seqlens)
        bins = masked.numel()
        seq_sum_S = masked.new_zeros(bins).index_add_(0, ids, masked)
        if agg == "seq-mean-token-mean":
            seq_n_S = mask.new_zeros(bins).index_add_(0, ids, mask.reshape(-1))
            seq_sum_S = seq_sum_S / seq_n_S.clamp(min=1)
        else:
            seq_n_S = mask.new_zeros(bins).index_add_(0, ids, mask.reshape(-1))
        n_seq = (seq_n_S > 0).sum()
        metrics["sequences"] = n_seq.detach().float()
        denom = n_seq.clamp(min=1) if loss_scale_denominator is None else loss_scale_denominator
        loss = seq_sum_S.sum() / denom
    metrics["loss"] = loss.detach()
    return loss, metrics
