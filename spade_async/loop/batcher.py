"""Turn scored episodes and designer samples into trainer samples.

Agent: GRPO z-scores over each environment's trained plays (no-hint plays; hinted ones too
when ``agent.train_on_hinted``; an episode the environment crashed or the engine refused
leaves the group, as in the reference -- a timeout stays, scored ``rewards.timeout_reward``); one sample per episode with the loss mask on agent tokens,
or with thinking fan-out one sample per turn (the prefix up to that turn, mask on that turn
only) each carrying the whole episode's advantage. Designer: the prompt + first-attempt
reply, advantage = per-skill centred reward x role-balance scale; masked samples dropped.

Staleness: samples whose oldest token comes from a policy more than ``max_staleness``
versions behind the trainer are dropped (and counted); younger ones reach the trainer with
their rollout log-probs, which it uses for truncated importance sampling.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from spade_async.rewards import grpo_advantages
from spade_async.roles.agent import UNTRAINED_STATUSES, AgentConfig, Episode
from spade_async.roles.designer import DesignSample
from spade_async.trainer.batch import Sample


@dataclass
class BatchStats:
    agent_samples: int = 0
    designer_samples: int = 0
    stale_dropped: int = 0
    zero_advantage: int = 0
    masked_designer: int = 0


def agent_samples(episodes: Sequence[Episode], cfg: AgentConfig) -> tuple[list[Sample], int]:
    """Samples and how many episodes had zero advantage (nothing to learn)."""
    groups: dict[tuple[str, bool], list[Episode]] = defaultdict(list)
    for ep in episodes:
        if ep.status in UNTRAINED_STATUSES:
            continue
        if ep.turn_spans and (cfg.train_on_hinted or not ep.hinted):
            groups[(ep.env_id, ep.hinted)].append(ep)
    out, zero = [], 0
    for eps in groups.values():
        for ep, adv in zip(eps, grpo_advantages([e.reward for e in eps]), strict=True):
            if adv == 0.0:
                zero += 1
                continue
            out.extend(_episode_samples(ep, adv, cfg.thinking_fanout))
    return out, zero


def _episode_samples(ep: Episode, adv: float, fanout: bool) -> list[Sample]:
    if not fanout:
        return [
            Sample(
                token_ids=ep.token_ids,
                loss_mask=ep.loss_mask,
                advantage=adv,
                rollout_logprobs=ep.logprobs,
                role="agent",
                policy_version=ep.version,
            )
        ]
    out = []
    for (start, end), version in zip(ep.turn_spans, ep.turn_versions, strict=True):
        if end <= start:
            continue
        mask = [0] * start + [1] * (end - start)
        out.append(
            Sample(
                token_ids=ep.token_ids[:end],
                loss_mask=mask,
                advantage=adv,
                rollout_logprobs=ep.logprobs[:end],
                role="agent",
                policy_version=version,
            )
        )
    return out


def designer_samples(
    samples: Sequence[DesignSample], advantages: Sequence[float], keep: Sequence[bool], scale: float
) -> list[Sample]:
    out = []
    for s, adv, k in zip(samples, advantages, keep, strict=True):
        if not k or not s.output_ids or adv == 0.0:
            continue
        n = len(s.prompt_ids)
        out.append(
            Sample(
                token_ids=s.prompt_ids + s.output_ids,
                loss_mask=[0] * n + [1] * len(s.output_ids),
                advantage=adv * scale,
                rollout_logprobs=[0.0] * n + s.logprobs,
                role="designer",
                policy_version=s.version,
            )
        )
    return out


def drop_stale(
    samples: Sequence[Sample], *, version: int, max_staleness: int, designer_slack: int = 0
) -> tuple[list[Sample], int]:
    """Keep samples at most ``max_staleness`` versions old (designer: plus its reward delay).

    Samples from a version newer than ``version`` come from a policy that is gone (a dead
    trainer restarted from an older checkpoint) and are dropped too."""
    kept = []
    for s in samples:
        limit = max_staleness + (designer_slack if s.role == "designer" else 0)
        if 0 <= version - s.policy_version <= limit:
            kept.append(s)
    return kept, len(samples) - len(kept)


def trim_batch(samples: Sequence[Sample], limit: int) -> tuple[list[Sample], int]:
    """The reference's per-step trim to its global batch (192): designer samples first, so
    the trim sheds surplus agent samples and never the designer's; ``limit`` 0 keeps all."""
    ordered = [s for s in samples if s.role == "designer"] + [
        s for s in samples if s.role != "designer"
    ]
    if limit <= 0 or len(ordered) <= limit:
        return ordered, 0
    return ordered[:limit], len(ordered) - limit
