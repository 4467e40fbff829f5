"""TEMPORARY stand-ins for spade_kernels (engineer E) until kernels/ lands; delete then."""

from __future__ import annotations

import torch


def linear_logprob(hidden_TD, weight_VD, target_T, *, temperature=1.0, return_entropy=False):
    logprobs_TV = torch.log_softmax((hidden_TD @ weight_VD.T).float() / temperature, dim=-1)
    logprob_T = logprobs_TV.gather(-1, target_T.long().unsqueeze(-1)).squeeze(-1)
    if not return_entropy:
        return logprob_T
    return logprob_T, -(logprobs_TV.exp() * logprobs_TV).sum(-1)


def policy_loss(logprob_T, old_logprob_T, advantage_T, mask_T, *, clip_low=0.2, clip_high=0.28,
                agg="token", rollout_logprob_T=None, tis_cap=2.0, ref_logprob_T=None,
                kl_coef=0.0, entropy_T=None, entropy_coef=0.0, seq_ids_T=None,
                loss_scale_denominator=None):
    ratio = torch.exp(logprob_T - old_logprob_T)
    pg = torch.maximum(-advantage_T * ratio,
                       -advantage_T * ratio.clamp(1 - clip_low, 1 + clip_high))
    if rollout_logprob_T is not None and tis_cap > 0:
        pg = pg * torch.exp(old_logprob_T - rollout_logprob_T).clamp(max=tis_cap).detach()
    per_tok = pg
    if ref_logprob_T is not None and kl_coef > 0:
        d = ref_logprob_T - logprob_T
        per_tok = per_tok + kl_coef * (d.exp() - d - 1)
    if entropy_T is not None and entropy_coef > 0:
        per_tok = per_tok - entropy_coef * entropy_T
    loss = (per_tok * mask_T).sum() / loss_scale_denominator
    return loss, {}
