"""Rewards and advantages for both roles, as docs/method.md defines them. Pure functions.

Agent: outcome-only reward (the final step's reward clipped to [-1, 1] when the episode
terminated, else 0; a step timeout scores -0.5), GRPO z-scores over each environment's plays.

Designer: hint-based regret ``mean R(hint) - mean R(no hint)`` -- for 'blend' the no-hint
plays taken at the policy versions that played the hinted ones (the reference's matched
timing), for 'regret' every no-hint play of the window, floored at 0 and unscaled, as the
reference's ``recompute_delayed_env_rewards_regret`` -- and the window's win rate (mean raw no-hint reward, as the reference) turned into a value by
one of the variants below. A negative value masks the sample out *before* per-skill centring
(masked samples never move their skill's mean); penalties (near-duplicate, an environment
that crashed or timed out) are applied after that decision, so they always reach the
trainer as a learning signal. Centred per skill (no std division: small-batch std blows it
up), scaled by the role-balance factor. docs/fidelity.md maps each choice to the reference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import msgspec

from spade_async.config import Doc

Variant = Literal["regret", "blend", "solve_rate", "learning_potential", "variance"]
TIMEOUT_REWARD = -0.5


class RewardConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    variant: Doc(
        Variant, "designer reward: regret | blend | solve_rate | learning_potential | variance"
    ) = "blend"
    regret_scale: Doc(
        float, "regret that earns the full regret term (clip(regret / scale, 0, 1))"
    ) = 0.15
    blend_regret_weight: Doc(
        float, "weight of the regret term in 'blend' (the plateau term gets 1 - this)"
    ) = 0.4
    regret_floor: Doc(
        bool,
        "'blend': clip the regret term to [0, 1] (reference recipes); false lets a negative "
        "regret through, and a negative blend is then masked",
    ) = True
    plateau_low: Doc(float, "no-hint win rates in [low, high] earn the full plateau score") = 0.4
    plateau_high: Doc(float, "upper edge of the plateau") = 0.6
    plateau_ramp: Doc(float, "width of the linear ramp to 0 on each side of the plateau") = 0.25
    variance_target: Doc(float, "'variance' variant: outcome variance that scores 1") = 0.25
    variance_width: Doc(float, "'variance' variant: exp(-(var - target)^2 / width)") = 0.02
    duplicate_penalty: Doc(
        float, "subtracted from a near-duplicate environment's designer reward"
    ) = 0.5
    mask_negative: Doc(bool, "mask designer samples whose reward (before centring) is negative") = (
        True
    )
    max_role_scale: Doc(float, "cap of the designer role-balance scale") = 50.0
    lp_slow_weight: Doc(
        float,
        "'learning_potential': weight of the newest window's win rate in the slow per-skill "
        "baseline, updated before use (reference --spare-gamma2 0.85)",
    ) = 0.85
    timeout_reward: Doc(float, "agent reward for an episode ended by an environment timeout") = (
        TIMEOUT_REWARD
    )
    win_rate: Doc(
        Literal["mean", "threshold"],
        "an environment's win rate: mean raw no-hint reward (reference; partial rewards count "
        "partly) or the share of plays at or above agent.success_threshold",
    ) = "mean"
    regret_plays: Doc(
        Literal["regen", "every_step"],
        "hinted plays once per window at regeneration, R_hint cached (reference), or every step",
    ) = "regen"
    env_fault_reward: Doc(
        float,
        "designer reward (never masked) of a faulted environment (see fault_penalty)",
    ) = TIMEOUT_REWARD
    fault_penalty: Doc(
        Literal["reference", "always"],
        "reference: only 'regret' penalises, and only step timeouts (other variants score the "
        "plays that completed); always: any crash or timeout, every variant",
    ) = "reference"


def check(cfg: RewardConfig, *, hints: bool, designer_train: bool) -> str | None:
    """A switch combination the method forbids, as one line (None: fine)."""
    if designer_train and not hints and cfg.variant == "regret":
        return (
            "rewards.variant = 'regret' needs hints (regret = R(hint) - R(no hint)); enable "
            "hint.enabled and agent.plays_hint > 0, or pick variant 'blend' or 'solve_rate'"
        )
    if cfg.regret_scale <= 0 or cfg.plateau_ramp <= 0:
        return "rewards.regret_scale and rewards.plateau_ramp must be > 0"
    if cfg.duplicate_penalty < 0 or cfg.env_fault_reward > 0:
        return (
            f"rewards.duplicate_penalty ({cfg.duplicate_penalty}) must be >= 0 and "
            f"rewards.env_fault_reward ({cfg.env_fault_reward}) <= 0: both are penalties"
        )
    return None


def agent_outcome(
    final_reward: float,
    terminated: bool,
    *,
    timed_out: bool = False,
    timeout_reward: float = TIMEOUT_REWARD,
) -> float:
    """Outcome-only agent reward."""
    if timed_out:
        return timeout_reward
    if not terminated or math.isnan(final_reward):
        return 0.0
    return max(-1.0, min(1.0, float(final_reward)))


def win_rate(
    rewards: Sequence[float],
    threshold: float = 1.0,
    how: Literal["mean", "threshold"] = "threshold",
) -> float:
    """'mean': mean raw reward (the reference's win rate); 'threshold': share >= threshold."""
    if not rewards:
        return 0.0
    if how == "mean":
        return _mean(rewards)
    return sum(r >= threshold for r in rewards) / len(rewards)


def wins(rewards: Sequence[float], threshold: float, how: Literal["mean", "threshold"]) -> float:
    """Numerator of ``win_rate`` (memory stores wins and plays)."""
    return win_rate(rewards, threshold, how) * len(rewards)


def matched_regret(hint: Sequence[tuple[int, float]], plain: Sequence[tuple[int, float]]) -> float:
    """Signed regret from ``(policy version, reward)`` plays: mean hinted reward minus the
    mean of the no-hint plays of the same policy versions (the reference's matched timing;
    schedule-independent). 0 when either side is empty; the variants floor it."""
    versions = {v for v, _ in hint}
    matched = [r for v, r in plain if v in versions]
    if not hint or not matched:
        return 0.0
    return _mean([r for _, r in hint]) - _mean(matched)


def regret(hint_rewards: Sequence[float], nohint_rewards: Sequence[float]) -> float:
    if not hint_rewards or not nohint_rewards:
        return 0.0
    return max(0.0, _mean(hint_rewards) - _mean(nohint_rewards))


def plateau(rate: float, cfg: RewardConfig) -> float:
    """1 inside [low, high]; linear ramp to 0 over ``ramp`` on each side."""
    if cfg.plateau_low <= rate <= cfg.plateau_high:
        return 1.0
    gap = cfg.plateau_low - rate if rate < cfg.plateau_low else rate - cfg.plateau_high
    return max(0.0, 1.0 - gap / cfg.plateau_ramp)


def designer_reward(
    cfg: RewardConfig,
    *,
    regret_value: float,
    nohint_win_rate: float,
    nohint_rewards: Sequence[float] = (),
    slow_ema_win_rate: float | None = None,
) -> float:
    """The configured variant's value (penalties come after masking: ``designer_advantages``)."""
    r_term = min(1.0, max(0.0, regret_value / cfg.regret_scale))
    match cfg.variant:
        case "regret":  # recompute_delayed_env_rewards_regret: unscaled, floored at 0
            value = max(0.0, regret_value)
        case "blend":
            w = cfg.blend_regret_weight
            r_blend = r_term if cfg.regret_floor else regret_value / cfg.regret_scale
            value = w * r_blend + (1.0 - w) * plateau(nohint_win_rate, cfg)
        case "solve_rate":
            value = plateau(nohint_win_rate, cfg)
        case "learning_potential":
            ema = nohint_win_rate if slow_ema_win_rate is None else slow_ema_win_rate
            value = abs(nohint_win_rate - ema)
        case "variance":
            var = (
                _var(nohint_rewards) if nohint_rewards else nohint_win_rate * (1 - nohint_win_rate)
            )
            value = math.exp(-((var - cfg.variance_target) ** 2) / cfg.variance_width)
    return value


def designer_advantages(
    cfg: RewardConfig,
    values: Sequence[float | None],
    skills: Sequence[str],
    *,
    duplicate: Sequence[bool],
) -> tuple[list[float], list[float], list[bool]]:
    """Rewards, advantages and keep-mask of a window's designer samples.

    ``values``: the variant's value per sample (0 for a broken first attempt), or None for an
    environment whose plays crashed or timed out (it earns ``env_fault_reward``). A negative
    value is masked (``mask_negative``) and left out of its skill's mean; the near-duplicate
    penalty is subtracted after that decision, so a duplicate is always a learning signal.
    """
    rewards, keep = [], []
    for v, dup in zip(values, duplicate, strict=True):
        if v is None:
            rewards.append(cfg.env_fault_reward)
            keep.append(True)
            continue
        rewards.append(v - (cfg.duplicate_penalty if dup else 0.0))
        keep.append(not (cfg.mask_negative and v < 0))
    by_skill: dict[str, list[float]] = defaultdict(list)
    for r, s, k in zip(rewards, skills, keep, strict=True):
        if k:
            by_skill[s].append(r)
    means = {s: _mean(v) for s, v in by_skill.items()}
    adv = [r - means[s] if k else 0.0 for r, s, k in zip(rewards, skills, keep, strict=True)]
    return rewards, adv, keep


def role_balance_scale(
    n_agent: int, n_designer: int, regen_interval: int, cap: float = 50.0
) -> float:
    """Designer loss scale ``min(n_agent / n_designer * regen_interval, cap)``."""
    if n_designer <= 0:
        return 0.0
    return min(n_agent / n_designer * regen_interval, cap)


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Z-scores over one environment's plays; all-equal rewards give zeros (nothing to learn)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean, std = _mean(rewards), math.sqrt(_var(rewards))
    if std < eps:
        return [0.0] * len(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def ema(previous: float | None, value: float, decay: float = 0.95) -> float:
    return value if previous is None else decay * previous + (1 - decay) * value


def slow_baseline(previous: float | None, value: float, newest_weight: float) -> float:
    """The reference's ``LearningPotential.mu_slow`` update: the first value as is, then
    ``(1 - w) * previous + w * value`` (w = --spare-gamma2, the weight on the newest)."""
    return value if previous is None else (1 - newest_weight) * previous + newest_weight * value


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
