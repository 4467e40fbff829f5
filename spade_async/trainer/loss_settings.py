"""The policy loss's settings, read once from the trainer config at start-up.

Both paths of a train step take them: the one-pass head (``PolicyTerms``, kernels/head.py)
and ``policy_loss`` (the metrics, or the loss itself with the recompute head). Building them
once keeps the two calls from drifting apart and the step from re-deriving them per
micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from spade_async.trainer.config import TrainerConfig

__all__ = ["LossSettings"]


@dataclass(frozen=True)
class LossSettings:
    clip_low: float
    clip_high: float
    tis_cap: float  # the cap on the importance weight; 1.0 (unused) when TIS is off
    use_tis: bool  # truncated importance sampling against the engine's log-probs
    kl_coef: float
    entropy_coef: float
    # old_logprobs = "rollout": slime's --use-rollout-logprobs --use-tis, the weight
    # min(exp(log p - rollout), cap) with log p the trainer's own, detached
    tis_current: bool
    old_detached: bool  # old_logprobs = "detached": the ratio's old side is log p itself
    agg: str  # "token", "seq-mean-token-sum", "seq-mean-token-mean"

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> LossSettings:
        return cls(
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            tis_cap=cfg.tis_cap if cfg.tis_cap > 0 else 1.0,
            use_tis=cfg.tis_cap > 0,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            tis_current=cfg.old_logprobs == "rollout",
            old_detached=cfg.old_logprobs == "detached",
            agg=cfg.loss_agg,
        )

    @property
    def want_entropy(self) -> bool:
        return self.entropy_coef > 0

    @property
    def per_sequence(self) -> bool:
        """The aggregation needs each token's sequence id."""
        return self.agg != "token"

    def shared(self) -> dict:
        """The keywords ``PolicyTerms`` and ``policy_loss`` both take, with equal meaning."""
        return {
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "tis_cap": self.tis_cap,
            "kl_coef": self.kl_coef,
            "entropy_coef": self.entropy_coef,
            "tis_current": self.tis_current,
        }
