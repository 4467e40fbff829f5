"""Turn scored episodes and designer samples into trainer samples.

Agent: GRPO z-scores over each environment's trained plays (no-hint plays; hinted ones too
when ``agent.train_on_hinted``; an episode the environment crashed or the engine refused
leaves the group, as in the reference -- a timeout stays, scored ``rewards.timeout_reward``);
one sample per episode with the loss mask on agent tokens, or with thinking fan-out one
sample per turn (the prefix up to that turn, mask on that turn only) each carrying the whole
episode's advantage; an episode's turn samples share one ``loss_group``, so a sample-mean
loss takes one token mean over the episode and counts it once (the reference gives them one
group id: slime's ``group_mask_sums`` and its global batch count episodes). A zero-advantage
sample stays in the batch (the reference's ``spare_rollout.py`` keeps every actor
trajectory; slime divides the loss by the global batch, so it counts in the denominator
and, with KL on, carries the KL gradient). With
``agent.compact_filter`` an episode cut short (env truncation, turn or token limit, a reply
without EOS: the reference's ``TRUNCATED``) keeps its place in its GRPO group and in the
loss denominator but trains nothing (``--spare-compact-filter`` zeroes its loss mask).
Designer: the prompt + first-attempt reply, advantage = per-skill centred reward x
role-balance scale; masked samples dropped.

Staleness: samples whose oldest token comes from a policy more than ``max_staleness``
versions behind the trainer are dropped (and counted); younger ones reach the trainer with
their rollout log-probs, which it uses for truncated importance sampling.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from spade_async.rewards import grpo_advantages
from spade_async.roles.agent import COMPACT_STATUSES, UNTRAINED_STATUSES, AgentConfig, Episode
from spade_async.roles.designer import DesignSample
from spade_async.trainer.batch import Sample


@dataclass
class BatchStats:
    agent_samples: int = 0
    designer_samples: int = 0
    stale_dropped: int = 0
    zero_advantage: int = 0
    masked_designer: int = 0


@dataclass
class AgentBatch:
    """The agent's share of one step.

    ``slots``: trainer samples in episode order, ``None`` for an episode the compact filter
    (or masked tool calls) emptied (one unit of the loss denominator and the batch trim,
    training nothing; with thinking fan-out one for the whole episode).
    ``episodes``: the actor trajectories of the step (every trained-role episode, whatever
    its advantage) -- the reference's ``num_actor_trajectories`` for the role-balance scale.
    """

    slots: list[Sample | None]
    zero_advantage: int = 0
    episodes: int = 0
    filtered: int = 0
    routes_dropped: int = 0  # episodes whose routes misfit (routing replay): dropped
    routes_stale: int = 0  # turns trained without replay: a weight update broke their rows

    @property
    def samples(self) -> list[Sample]:
        return [s for s in self.slots if s is not None]


def agent_batch(episodes: Sequence[Episode], cfg: AgentConfig) -> AgentBatch:
    groups: dict[tuple[str, bool], list[Episode]] = defaultdict(list)
    out = AgentBatch(slots=[])
    for ep in episodes:
        if ep.status in UNTRAINED_STATUSES:
            continue
        if routes_misfit(ep.routes_status):  # out of its group, as an engine refusal
            out.routes_dropped += 1
            continue
        if ep.turn_spans and (cfg.train_on_hinted or not ep.hinted):
            groups[(ep.env_id, ep.hinted)].append(ep)
    for eps in groups.values():
        for ep, adv in zip(eps, grpo_advantages([e.reward for e in eps]), strict=True):
            split = len(ep.route_epochs) > 1  # a sample per route epoch: one loss unit
            group = out.episodes if cfg.thinking_fanout or split else -1
            out.routes_stale += sum(e - f for f, e, rows in ep.route_epochs if not rows)
            out.episodes += 1
            out.zero_advantage += adv == 0.0
            samples = _episode_samples(ep, adv, cfg.thinking_fanout, group)
            if cfg.compact_filter and ep.status in COMPACT_STATUSES:
                samples = []
            live = [s for s in samples if any(s.loss_mask)]
            if not live:  # compact filter, malformed tool calls: one unit, trains nothing
                out.filtered += 1
                out.slots.append(None)
            else:  # fan-out: a masked turn adds nothing to its episode's mean
                out.slots += live
    return out


def loss_units(slots: Sequence[Sample | None]) -> int:
    """How many units a sample-mean loss counts in ``slots``: samples, an episode's turn
    samples (one ``loss_group``) once, and each ``None`` slot (it trains nothing)."""
    groups = {s.loss_group for s in slots if s is not None and s.loss_group >= 0}
    return len(groups) + sum(s is None or s.loss_group < 0 for s in slots)


def routes_misfit(status: str) -> bool:
    """Routes an engine sent that do not fit the sample (``Episode.routes_status``): the
    sample is dropped. Missing routes ("missing") and rows a weight update made stale
    ("stale", roles/designer.py) train without replay."""
    return status not in ("", "missing", "stale")


def agent_samples(episodes: Sequence[Episode], cfg: AgentConfig) -> tuple[list[Sample], int]:
    """Trainer samples (zero-advantage ones included) and how many episodes had zero
    advantage."""
    b = agent_batch(episodes, cfg)
    return b.samples, b.zero_advantage


def _episode_samples(ep: Episode, adv: float, fanout: bool, group: int = -1) -> list[Sample]:
    if not fanout and len(ep.route_epochs) > 1:
        return _epoch_samples(ep, adv, group)
    if not fanout:
        return [
            Sample(
                token_ids=ep.token_ids,
                loss_mask=ep.loss_mask,
                advantage=adv,
                rollout_logprobs=ep.logprobs,
                role="agent",
                policy_version=ep.version,
                routed_experts=ep.routed_experts,
            )
        ]
    out = []
    spans = zip(ep.turn_spans, ep.turn_versions, strict=True)
    for turn, ((start, end), version) in enumerate(spans):
        if end <= start:
            continue
        mask = [0] * start + list(ep.loss_mask[start:end])  # malformed turns stay masked
        out.append(
            Sample(
                token_ids=ep.token_ids[:end],
                loss_mask=mask,
                advantage=adv,
                rollout_logprobs=ep.logprobs[:end],
                role="agent",
                policy_version=version,
                loss_group=group,
                routed_experts=_turn_routes(ep, turn),  # the trainer reads the rows it runs
            )
        )
    return out


def _turn_routes(ep: Episode, turn: int) -> bytes:
    """The rows of the route epoch that holds ``turn`` (roles/episode_routes.py)."""
    for first, end, rows in ep.route_epochs:
        if first <= turn < end:
            return rows
    return ep.routed_experts


def _epoch_samples(ep: Episode, adv: float, group: int) -> list[Sample]:
    """One sample per route epoch of an episode a weight update split: the tokens up to the
    epoch's last turn, trained on that epoch's turns only, with the rows they were sampled
    with (b"": without replay). Together they train what the one episode sample would."""
    out = []
    for first, end, rows in ep.route_epochs:
        start, stop = ep.turn_spans[first][0], ep.turn_spans[end - 1][1]
        mask = [0] * start + list(ep.loss_mask[start:stop])
        out.append(
            Sample(
                token_ids=ep.token_ids[:stop],
                loss_mask=mask,
                advantage=adv,
                rollout_logprobs=ep.logprobs[:stop],
                role="agent",
                policy_version=min(ep.turn_versions[first:end]),
                loss_group=group,
                routed_experts=rows,
            )
        )
    return out


def designer_samples(
    samples: Sequence[DesignSample], advantages: Sequence[float], keep: Sequence[bool], scale: float
) -> list[Sample]:
    out = []
    for s, adv, k in zip(samples, advantages, keep, strict=True):
        if not k or not s.output_ids:  # masked, or nothing generated; zero advantage stays
            continue
        if routes_misfit(s.routes_status):  # routes that fit no token: dropped (counted)
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
                routed_experts=s.routed_experts,
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


def trim_batch(samples: Sequence[Sample | None], limit: int) -> tuple[list[Sample | None], int]:
    """The reference's per-step trim to its global batch (192): designer samples first, so
    the trim sheds surplus agent samples and never the designer's; ``limit`` 0 keeps all.
    ``None`` slots (compact-filtered agent samples) take their place like any agent sample."""
    ordered = [s for s in samples if s is not None and s.role == "designer"] + [
        s for s in samples if s is None or s.role != "designer"
    ]
    if limit <= 0 or len(ordered) <= limit:
        return ordered, 0
    return ordered[:limit], len(ordered) - limit


def loss_normaliser(n_real: int, limit: int, *, kl_coef: float, entropy_coef: float) -> float:
    """How many samples the step's sample-mean loss divides by, as the reference's
    (``n_real``: units, ``loss_units``; an episode's turn samples are one).

    slime divides by the (dynamic) global batch; ``spare_rollout.py`` pads a short batch to
    ``--global-batch-size`` with inert copies and, when only the policy-gradient term is on
    (no KL, no entropy), scales the real rewards by ``global_batch / n_real`` so the loss
    divides by ``n_real``: every real sample, zero-advantage and compact-filtered ones
    included. With KL or entropy on it does not rescale and a short batch divides by the
    global batch. ``limit`` 0 (no global batch): ``n_real``."""
    if limit > 0 and n_real < limit and (kl_coef != 0.0 or entropy_coef != 0.0):
        return float(limit)
    return float(max(n_real, 1))
