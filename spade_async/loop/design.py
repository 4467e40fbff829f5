"""The designer's side of a SPADE cycle: a regeneration window (``Window``), the skill
rotation, one regeneration round (``regenerate``: prompts from corpus documents and memory,
``design_group`` per prompt, the validation verdicts counted and logged), and the scoring of
a window's designer samples from the agent plays gathered over it (``score_designs``,
``designer_batch``). ``cycle.py`` re-exports these; the schedules call them through it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from spade_async.generation.seeds import request_seed
from spade_async.loop.audits import is_quarantined
from spade_async.rewards import (
    designer_advantages,
    designer_reward,
    matched_regret,
    role_balance_scale,
    slow_baseline,
    win_rate,
)
from spade_async.roles.designer import DesignSample, build_prompt, design_group
from spade_async.roles.services import Services
from spade_async.trainer.batch import Sample

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime

__all__ = ["Window", "active_skills", "regenerate", "score_designs", "designer_batch"]


@dataclass
class Window:
    """A regeneration window: its designer samples, the hints written for its environments
    (once per window) and the plays of its environments as ``(policy version, reward)``."""

    samples: list[DesignSample] = field(default_factory=list)
    hints: dict[str, str | None] = field(default_factory=dict)
    hint_plays: dict[str, list[tuple[int, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    plain_plays: dict[str, list[tuple[int, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    timeouts: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def active_skills(skills: tuple[str, ...], epoch: int, k: int) -> list[str]:
    """The reference's rotation: regeneration epoch ``e`` takes the ``k`` skills starting at
    ``e * k`` (mod the number of skills), so every skill comes round and none idles long."""
    n = len(skills)
    if k <= 0 or k >= n:
        return [str(s) for s in skills]
    start = (epoch * k) % n
    return [str(skills[(start + j) % n]) for j in range(k)]  # plain str: msgpack-encoded


async def regenerate(rt: Runtime, version: int) -> list[DesignSample]:
    d = rt.cfg.designer
    skills = active_skills(d.skills, version // rt.cfg.regen_interval, d.skills_per_regen)
    groups = []
    for skill in skills:
        for _ in range(d.prompts_per_skill):
            doc = rt.corpus.sample(1, rng=rt.rng)[0] if rt.corpus is not None else None
            prompt, shown = build_prompt(
                d,
                skill=skill,
                document=doc.text if doc else None,
                store=rt.store if d.use_memory else None,
                rng=rt.rng,
                max_turns=rt.cfg.agent.max_turns,
            )
            groups.append((skill, doc.id if doc else None, prompt, shown))
    done: dict[int, list[DesignSample]] = {}
    # deterministic: one group at a time, so memory sees its records (and near duplicates
    # their twins) in the same order every run
    limiter = anyio.CapacityLimiter(1 if rt.cfg.deterministic else max(1, len(groups)))

    async def one(g: int, skill, doc_id, prompt, shown) -> None:
        # engine and pool (validation) time are metered inside design_group
        async with limiter:
            done[g] = await design_group(
                Services.of(rt),
                writer=rt.writer,
                run_dir=rt.run_dir,
                cfg=d,
                prompt=prompt,
                skill=skill,
                doc_id=doc_id,
                version=version,
                examples=shown,
                seed=request_seed(rt.cfg.seed, "designer", rt.state.step, version, g, skill),
            )

    async with anyio.create_task_group() as tg:
        for g, group in enumerate(groups):
            tg.start_soon(one, g, *group)
    out = [s for g in sorted(done) for s in done[g]]  # group order, not completion order
    for s in out:
        rt.meters.add_tokens("designer", len(s.output_ids) + s.extra_tokens)
        rt.meters.count("designer/generated")
        rt.meters.count(f"designer/stage/{s.verdict.stage}")
        rt.meters.count("designer/valid", int(s.verdict.valid))
        rt.meters.count("designer/duplicates", int(s.duplicate))
        rt.meters.count("designer/retries", s.retries)
        rt.meters.count("designer/filled_by_retry", int(s.retries > 0 and s.env_id is not None))
        rt.tel.log(
            rt.state.step,
            {
                "env_id": s.env_id or "",
                "env_class": s.verdict.env_class or "",
                "skill": s.skill,
                "stage": s.verdict.stage,
                "valid": s.verdict.valid,
                "win_rate": None,
                "regret": None,
                "duplicate": s.duplicate,
                "retries": s.retries,
                "shown": s.examples,  # lineage: the memory examples in its prompt
            },
            kind="env",
        )
    return out


def score_designs(
    rt: Runtime, window: Window
) -> tuple[list[DesignSample], list[float], list[float], list[bool]]:
    """The window's scored designer samples, their rewards, advantages and keep-mask.

    A broken first attempt is worth 0. A faulted environment earns the fault penalty: with
    ``rewards.fault_penalty = 'reference'`` only under 'regret' and only for a step timeout
    (``recompute_delayed_env_rewards_regret``'s STEP_TIMEOUT_PENALTY; the other variants
    score the plays that completed), with 'always' for any crash or timeout. A valid
    environment that got no no-hint play in the window (all its groups dropped as stale, or
    every play faulted) is left out, unscored. 'blend' pairs the hinted plays with the
    no-hint plays of the same policy versions, 'regret' with every no-hint play of the
    window; the win rate uses every no-hint play. 'learning_potential' moves each skill's
    slow baseline with the skill's pooled no-hint plays first, then scores
    ``|win rate - baseline|`` (the reference's delayed LP update)."""
    cfg, thr = rt.cfg.rewards, rt.cfg.agent.success_threshold
    scored: list[DesignSample] = []
    values: list[float | None] = []
    if cfg.variant == "learning_potential":  # update before use, pooled plays per skill
        games: dict[str, set[str]] = defaultdict(set)
        for s in window.samples:
            if s.verdict.valid and s.env_id is not None:
                games[s.skill].add(s.env_id)
        for skill, ids in games.items():
            plays = [r for e in sorted(ids) for _, r in window.plain_plays.get(e, [])]
            if plays:
                prev = rt.state.skill_ema.get(skill)
                rt.state.skill_ema[skill] = slow_baseline(
                    prev, sum(plays) / len(plays), cfg.lp_slow_weight
                )
    for s in window.samples:
        # broken first attempt, or quarantined by an audit while its window is open: reward 0
        if not s.verdict.valid or s.env_id is None or is_quarantined(rt, s.env_id):
            scored.append(s)
            values.append(0.0)
            continue
        if _penalised(cfg, window, s.env_id):
            scored.append(s)
            values.append(None)
            continue
        plain = [r for _, r in window.plain_plays.get(s.env_id, [])]
        if not plain:
            rt.meters.count("designer/unscored")
            continue
        rate = win_rate(plain, thr, cfg.win_rate)
        hinted = window.hint_plays.get(s.env_id, [])
        if cfg.variant == "regret":
            r = _mean_of([x for _, x in hinted]) - _mean_of(plain) if hinted else 0.0
        else:
            r = matched_regret(hinted, window.plain_plays[s.env_id])
        scored.append(s)
        values.append(
            designer_reward(
                cfg,
                regret_value=r,
                nohint_win_rate=rate,
                nohint_rewards=plain,
                slow_ema_win_rate=rt.state.skill_ema.get(s.skill),
            )
        )
    # a broken first attempt scores 0 whatever its retry became: the retry's duplicate flag
    # belongs to the retry's environment, not to the trained attempt
    rewards, adv, keep = designer_advantages(
        cfg,
        values,
        [s.skill for s in scored],
        duplicate=[s.duplicate and s.verdict.valid for s in scored],
    )
    return scored, rewards, adv, keep


def _penalised(cfg, window: Window, env_id: str) -> bool:
    if cfg.fault_penalty == "always":
        return bool(window.faults.get(env_id))
    return cfg.variant == "regret" and bool(window.timeouts.get(env_id))


def _mean_of(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


async def designer_batch(rt: Runtime, window: Window, n_agent: int) -> tuple[list[Sample], float]:
    """Score the window's designer samples from the plays accumulated over it; the
    trainer samples (advantage x role-balance scale) and the mean designer reward."""
    from spade_async.loop.batcher import designer_samples

    scored, rewards, adv, keep = score_designs(rt, window)
    for s, value in zip(scored, rewards, strict=True):
        if s.env_id is not None and s.verdict.valid:
            await rt.writer.update_stats(s.env_id, designer_reward=value, version=rt.state.version)
    rt.meters.count("designer/masked", sum(not k for k in keep))
    scale = role_balance_scale(
        n_agent, max(1, len(scored)), rt.cfg.regen_interval, rt.cfg.rewards.max_role_scale
    )
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return designer_samples(scored, adv, keep, scale), mean
