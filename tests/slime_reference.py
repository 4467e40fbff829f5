"""slime's policy loss written out from its source, in float64 -- not from our kernels.

The reference SPADE trains on slime (the submodule ``spade-rl/spade`` pins; the formulas
below read the same on slime's main). Each function names the slime file and function it
transcribes; only plain torch is used, so a test that compares our heads and trainer with
these compares them with slime, not with themselves. Shape legend: N_i tokens of sample i.

- ``slime/utils/ppo_utils.py`` ``compute_approx_kl(kl_loss_type="low_var_kl")``:
  log_ratio = -(log_probs - log_probs_base); kl = exp(log_ratio) - 1 - log_ratio, then
  ``torch.clamp(kl, min=-10, max=10)``.
- ``ppo_utils.compute_policy_loss``: ratio = exp(-ppo_kl), ppo_kl = old - log_probs;
  pg = max(-ratio A, -clamp(ratio, 1 - eps_clip, 1 + eps_clip_high) A).
- ``slime/backends/megatron_utils/loss.py`` ``policy_loss_function``: old_log_probs is
  ``batch["rollout_log_probs"]`` under --use-rollout-logprobs, else ``batch["log_probs"]``
  (the trainer's own forward before the step); ``vanilla_tis_function``: tis =
  exp(train_log_probs - rollout_log_probs) with train_log_probs = ``batch["log_probs"]``
  (or the current log-probs, detached, when absent), weight = clamp(tis, tis_clip_low = 0,
  tis_clip); loss = mean(pg) - entropy_coef mean(entropy) + kl_loss_coef mean(kl), each
  mean by ``sum_of_sample_mean``.
- ``slime/backends/megatron_utils/cp_utils.py`` ``get_sum_of_sample_mean``: per sample
  sum(x_i mask_i) / clamp_min(mask_i.sum(), 1); samples of one group (an episode fanned out
  into turn samples, ``spare/slime/trajectory_converter.py`` ``fan_out_thinking_sample``:
  "the loss reducer averages it once") divide by the group's mask sum
  (``group_mask_sums``). With --calculate-per-token-loss: sum(x_i mask_i) (``sum_of_token``).
- ``loss.py`` ``loss_function``: a sample-mean loss is scaled by num_microbatches /
  step_global_batch_size (the global batch counts groups); a per-token loss is divided by
  ``num_tokens = sum(clamp_min(loss_mask.sum(), 1))`` (Megatron's per-token normaliser).

``seq-mean-token-sum`` is ours, not slime's: sum over units of their token sums / units.
"""

from __future__ import annotations

import torch

KL_CLAMP = 10.0  # compute_approx_kl: torch.clamp(kl, min=-10, max=10)


def low_var_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor) -> torch.Tensor:
    """ppo_utils.compute_approx_kl, kl_loss_type="low_var_kl", no importance ratio."""
    log_ratio = log_probs - log_probs_base
    log_ratio = -log_ratio
    kl = log_ratio.exp() - 1 - log_ratio
    return torch.clamp(kl, min=-KL_CLAMP, max=KL_CLAMP)


def policy_loss(ppo_kl, advantages, eps_clip: float, eps_clip_high: float) -> torch.Tensor:
    """ppo_utils.compute_policy_loss without dual clip (eps_clip_c None)."""
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    return torch.maximum(pg_losses1, pg_losses2)


def sum_of_sample_mean(x, lengths, masks, groups) -> torch.Tensor:
    """cp_utils.get_sum_of_sample_mean (cp 1) with per-group denominators."""
    group_sum: dict[int, torch.Tensor] = {}
    for m, g in zip(masks, groups, strict=True):
        group_sum[g] = group_sum.get(g, 0) + m.sum()
    return sum(
        (x_i * m).sum() / torch.clamp_min(group_sum[g], 1)
        for x_i, m, g in zip(x.split(lengths), masks, groups, strict=True)
    )


def sum_of_token(x, lengths, masks) -> torch.Tensor:
    """cp_utils.get_sum_of_sample_mean with calculate_per_token_loss."""
    return sum((x_i * m).sum() for x_i, m in zip(x.split(lengths), masks, strict=True))


def slime_loss(
    log_probs: list[torch.Tensor],
    masks: list[torch.Tensor],
    advantages: list[torch.Tensor],
    *,
    groups: list[int] | None = None,
    mode: str = "sample_mean",
    units: int | None = None,
    absent_zero_mask_samples: int = 0,
    old_log_probs: list[torch.Tensor] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
    use_rollout_logprobs: bool = False,
    use_tis: bool = False,
    tis_clip: float = 2.0,
    ref_log_probs: list[torch.Tensor] | None = None,
    kl_loss_coef: float = 0.0,
    entropy: list[torch.Tensor] | None = None,
    entropy_coef: float = 0.0,
    eps_clip: float = 0.2,
    eps_clip_high: float = 0.28,
) -> torch.Tensor:
    """The step's loss as slime's policy_loss_function + loss_function give it.

    ``mode``: "sample_mean" (slime's default), "per_token" (--calculate-per-token-loss) or
    "seq_sum" (ours). ``units``: the global batch (groups; default: the groups present).
    ``absent_zero_mask_samples``: samples of the step with an all-zero mask that the list
    leaves out (each adds clamp_min(0, 1) = 1 to the per-token normaliser).
    ``old_log_probs`` None: batch["log_probs"] equals the current log-probs (detached)."""
    lengths = [len(m) for m in masks]
    groups = list(range(len(masks))) if groups is None else groups
    units = len(set(groups)) if units is None else units
    lp = torch.cat(log_probs)
    train = (
        [x.detach() for x in log_probs] if old_log_probs is None else old_log_probs
    )  # batch["log_probs"]
    old = torch.cat(rollout_log_probs if use_rollout_logprobs else train)
    adv = torch.cat(advantages)
    pg = policy_loss(old - lp, adv, eps_clip, eps_clip_high)
    if use_tis:
        tis = torch.exp(torch.cat(train) - torch.cat(rollout_log_probs))
        pg = pg * torch.clamp(tis, min=0.0, max=tis_clip)

    def reduce(x):
        if mode == "sample_mean":
            return sum_of_sample_mean(x, lengths, masks, groups) / units
        if mode == "per_token":
            n = sum(torch.clamp_min(m.sum(), 1) for m in masks) + absent_zero_mask_samples
            return sum_of_token(x, lengths, masks) / n
        assert mode == "seq_sum", mode
        return sum_of_token(x, lengths, masks) / units

    loss = reduce(pg)
    if entropy_coef:
        loss = loss - entropy_coef * reduce(torch.cat(entropy))
    if kl_loss_coef:
        loss = loss + kl_loss_coef * reduce(low_var_kl(lp, torch.cat(ref_log_probs)))
    return loss


def head_logprobs(hidden_TD, weight_VD, target_T, temperature: float):
    """Log-probs and entropies of softmax(hidden @ weight.T / temperature) (slime's
    get_responses divides the logits by the temperature; its entropy is the distribution's)."""
    logits = hidden_TD @ weight_VD.T / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(1, target_T[:, None]).squeeze(1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent
