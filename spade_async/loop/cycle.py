"""The pieces of one SPADE cycle, shared by the sync and async schedules.

regenerate -> hints -> play -> score -> samples. Each piece takes the ``Runtime`` and
returns plain data; ``schedule_sync.py`` runs them in turn, the async controller overlaps
them. The designer's pieces (regeneration window, skill rotation, scoring of designs) live in
``design.py`` and are reached through this module. Nothing here raises for a misbehaving environment or an empty designer batch: those
are counted in metrics.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from spade_async.episodes.journal import note_finished, note_started, note_trained
from spade_async.episodes.records import log_episode
from spade_async.generation.seeds import request_seed
from spade_async.loop import audits
from spade_async.loop.design import (  # noqa: F401  (the schedules and tests reach them here)
    Window,
    active_skills,
    designer_batch,
    regenerate,
    score_designs,
)
from spade_async.memory.sampling import replay_sample
from spade_async.rewards import regret, win_rate, wins
from spade_async.roles.agent import FAULT_STATUSES, EnvRef, Episode, play_episode, transcript
from spade_async.roles.hint import write_hint
from spade_async.roles.services import Services
from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.client import PushRefused, TrainerDied

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime


def env_refs(rt: Runtime, env_ids: list[str]) -> list[EnvRef]:
    refs = []
    for env_id in dict.fromkeys(env_ids):
        rec = rt.store.get(env_id)
        if rec is not None and rec.valid and not rec.quarantine:
            refs.append(EnvRef(env_id=rec.id, source=rec.code, setting=rec.setting))
    return refs


async def replay(rt: Runtime, n: int) -> list[str]:
    """PLR replay: ``n`` memory environments for the agent, marked as replayed (staleness)."""
    if n <= 0:
        return []
    ids = replay_sample(rt.store, n, version=rt.state.version, rng=rt.rng)
    if ids:
        await rt.writer.mark_replayed(ids, rt.state.version)
    return ids


async def window_hints(
    rt: Runtime, window: Window, envs: list[EnvRef], *, fresh: bool
) -> dict[str, str | None]:
    """Hints for one round of plays, written once per window and environment. With
    ``rewards.regret_plays = 'regen'`` (the reference) the hinted plays happen only in the
    window's first round (``fresh``) and R(hint) is cached in the window; 'every_step'
    replays the cached hints every round. Both schedules call this the same way."""
    if not (fresh or rt.cfg.rewards.regret_plays == "every_step"):
        return {}
    missing = [e for e in envs if e.env_id not in window.hints]
    window.hints.update(await hints_for(rt, missing))
    return window.hints


async def hints_for(rt: Runtime, envs: list[EnvRef]) -> dict[str, str | None]:
    hints: dict[str, str | None] = {}
    if not rt.cfg.hint.enabled or rt.cfg.agent.plays_hint == 0:
        return hints

    async def one(env: EnvRef) -> None:
        with rt.meters.busy("engine"):
            res = await write_hint(
                Services.of(rt),
                env=env,
                seed=int(rt.rng.integers(2**31)),
                cfg=rt.cfg.hint,
                request_key=request_seed(rt.cfg.seed, "hint", rt.state.step, env.env_id),
            )
        hints[env.env_id] = res.hint
        if res.hint is not None:
            await rt.writer.add_hint(env.env_id, res.hint)
        rt.meters.add_tokens("hint", res.tokens)
        rt.meters.count("hint/leaks", res.leaks)
        rt.meters.count("hint/dropped", int(res.hint is None))

    async with anyio.create_task_group() as tg:
        for env in envs:
            tg.start_soon(one, env)
    return hints


def plays_per_env(cfg, n_envs: int) -> int:
    """No-hint plays per environment: the reference's ``ceil(global_batch / games played)``
    (its collect stage), so a step whose designs partly failed still fills the batch; with
    ``agent.plays_per_env = 'fixed'`` or no global batch (``batch_samples`` 0),
    ``agent.plays_nohint``."""
    if cfg.agent.plays_per_env == "fill_batch" and cfg.batch_samples > 0 and n_envs > 0:
        return math.ceil(cfg.batch_samples / n_envs)
    return cfg.agent.plays_nohint


async def play(
    rt: Runtime,
    envs: list[EnvRef],
    hints: dict[str, str | None],
    version: int,
    plays_nohint: int | None = None,
) -> list[Episode]:
    """Every environment's no-hint plays (``plays_nohint``, default ``agent.plays_nohint``),
    and its hinted plays on the same seeds (paired). Returned in the order they were
    started (environment, then slot), whatever order they finish in; each play's requests
    carry seeds from (run seed, step, version, environment, slot, reset seed)."""
    cfg = rt.cfg.agent
    n_plain = cfg.plays_nohint if plays_nohint is None else plays_nohint
    limiter = anyio.CapacityLimiter(max(1, rt.cfg.max_concurrent_episodes))
    done: dict[int, Episode] = {}
    step = rt.state.step
    aud = audits.auditor(rt)  # scripted audit slots (loop/audits.py)
    svc = Services.of(rt)
    envs = [e for e in envs if not audits.is_quarantined(rt, e.env_id)]

    async def one(env: EnvRef, seed: int, hint: str | None, slot: int, pace=None) -> None:
        key = request_seed(rt.cfg.seed, "agent", step, version, env.env_id, slot, seed)
        async with limiter:
            rt.meters.count("agent/started")
            jid = note_started(rt)  # the episode journal (docs/resume.md)
            ep = await play_episode(
                svc,
                env=env,
                seed=seed,
                hint=hint,
                cfg=cfg,
                version=version,
                timeout_reward=rt.cfg.rewards.timeout_reward,
                request_key=key,
                pace=pace,
            )
        done[slot] = ep
        aud.record(ep, pace)  # its replies: garbage for other environments' audits
        log_episode(rt, env, ep)  # RUN_DIR/episodes/records.jsonl: what replay needs
        rt.meters.add_tokens("agent", sum(b - a for a, b in ep.turn_spans))
        rt.meters.count(f"agent/status/{ep.status}")
        await note_finished(rt, jid, ep)  # on disk before the consumer takes it

    slots = 0
    async with anyio.create_task_group() as tg:
        for env in envs:
            seeds = [int(s) for s in rt.rng.integers(2**31, size=max(n_plain, cfg.plays_hint))]
            hint = hints.get(env.env_id)
            paces, scripted = audits.group_plan(rt, env.env_id, n_plain)
            for i, (seed, h) in enumerate(
                [(s, None) for s in seeds[:n_plain]]
                + ([(s, hint) for s in seeds[: cfg.plays_hint]] if hint else [])
            ):
                if i in scripted:  # paced by a real sibling's turns; never trained
                    pacer, kind, garbage = scripted[i]
                    real = functools.partial(one, env, seed, None, slots)  # if none can run
                    tg.start_soon(
                        audits.run_scripted, rt, env, seed, paces[pacer], limiter, kind, garbage,
                        real,
                    )  # fmt: skip
                else:
                    tg.start_soon(one, env, seed, h, slots, paces.get(i) if h is None else None)
                slots += 1
    return [done[i] for i in sorted(done)]


async def score(
    rt: Runtime, episodes: list[Episode], window: Window | None
) -> dict[str, list[float]]:
    """Per-environment statistics into memory (and the designer window); returns the
    regrets and no-hint win rates of the environments scored, for the dashboard. Plays the
    environment crashed or timed out count as its faults, not as plays; a play the engine
    refused (``engine_error``) is no play at all (the reference drops FAILED trajectories
    from its accumulation)."""
    thr, how = rt.cfg.agent.success_threshold, rt.cfg.rewards.win_rate
    by_env: dict[str, tuple[list[Episode], list[Episode]]] = defaultdict(lambda: ([], []))
    for ep in episodes:
        if ep.status in FAULT_STATUSES:
            if window is not None:
                window.faults[ep.env_id] += 1
                window.timeouts[ep.env_id] += ep.status == "timeout"
            continue
        if ep.status == "engine_error":  # no play happened: the reference drops FAILED plays
            continue
        by_env[ep.env_id][0 if ep.hinted else 1].append(ep)
    regrets, rates = [], []
    for env_id, (hinted_eps, plain_eps) in by_env.items():
        hinted = [e.reward for e in hinted_eps]
        plain = [e.reward for e in plain_eps]
        r = regret(hinted, plain)
        await rt.writer.update_stats(
            env_id,
            plays_hint=len(hinted),
            wins_hint=wins(hinted, thr, how),
            plays_nohint=len(plain),
            wins_nohint=wins(plain, thr, how),
            regret=r if hinted and plain else None,
            version=rt.state.version,
        )
        if plain:
            regrets.append(r)
            rates.append(win_rate(plain, thr, how))
        if window is not None:
            window.hint_plays[env_id].extend((e.version, e.reward) for e in hinted_eps)
            window.plain_plays[env_id].extend((e.version, e.reward) for e in plain_eps)
    return {"regret/values": regrets, "win_rate/values": rates}


def write_transcripts(rt: Runtime, episodes: list[Episode]) -> None:
    for i, ep in enumerate(episodes[: rt.cfg.telemetry.episodes_per_step]):
        rt.run_dir.save_transcript(f"step-{rt.state.step:05d}-{i}", transcript(ep))


async def train_and_push(
    rt: Runtime, samples: list[Sample], *, pause: bool, normaliser: float = 0.0
) -> dict[str, float]:
    """One trainer step, then the weights to every engine (paused around the push when
    generation is in flight); the engines' version becomes the trainer's.

    Colocated with memory release (``rt.release_memory``; sync schedule, engines idle), the
    engines give their GPU memory to the trainer first and take it back in slime's order:
    release all -> train -> resume weights -> push -> resume the rest. Every call names its
    tags: SGLang's resume removes each named tag from its offload set and dies (KeyError)
    on one it no longer holds, and no tags means all of them (``sglang_state.py``).

    ``normaliser``: the sample count a sample-mean loss divides by (``batcher.loss_normaliser``;
    0: the batch's own count)."""
    from spade_async.generation.sglang_state import MEMORY_TAGS

    rest = [t for t in MEMORY_TAGS if t != "weights"]  # the KV cache and the CUDA graphs
    if not samples:
        rt.meters.count("train/empty_batches")
        return {}
    # shielded: a Ctrl-C never leaves the trainer mid-call or the engines behind its version
    with anyio.CancelScope(shield=True), rt.meters.busy("trainer"):
        if rt.release_memory:
            await rt.client.release_memory(list(MEMORY_TAGS))
        died = ""
        try:
            with rt.meters.busy("train"):  # phases of the trainer's busy time (report)
                metrics = await rt.trainer.train_step(
                    Batch(samples=samples, loss_normaliser=normaliser)
                )
        except TrainerDied as exc:
            died, metrics = str(exc), {}
        if rt.release_memory:
            await rt.client.resume_memory(["weights"])
        if died:  # the batch is lost; the restarted trainer pushes its checkpoint's weights
            rt.meters.count("train/lost_batches")
            await rt.restart_trainer(died, pause=pause)
        else:
            with rt.meters.busy("push"):
                metrics = {**metrics, **await _push(rt, pause)}
        if rt.release_memory:
            await rt.client.resume_memory(rest)
    if metrics:
        rt.meters.add_tokens("trainer", sum(len(s.token_ids) for s in samples))
    return metrics


async def _push(rt: Runtime, pause: bool) -> dict[str, float]:
    """``rt.push``; a trainer that dies in it is restarted. Returns the push's time and how
    long generation was paused for it.

    A trainer that dies mid-push has trained this batch, but its version reached neither the
    engines nor a checkpoint (checkpoints follow the push): the batch is lost and counted."""
    try:
        pushed = await rt.push(pause=pause)
    except TrainerDied as exc:
        rt.meters.count("train/lost_batches")
        await rt.restart_trainer(str(exc), pause=pause)
        return {}
    except PushRefused as exc:  # engines keep their version; the next push sends everything
        rt.meters.count("train/lost_batches")
        rt.meters.count("push/refused")
        rt.tel.event(rt.state.step, f"weight push refused, batch lost: {exc}")
        return {}
    return {"push_s": pushed.seconds, "push_paused_s": pushed.paused_s}


@dataclass
class StepBatch:
    """What one trainer step takes: its samples, the count its sample-mean loss divides by,
    and for the metrics the zero-advantage episodes and the window's mean designer reward."""

    samples: list[Sample]
    normaliser: float
    zero_advantage: int
    designer_mean: float | None


async def step_batch(
    rt: Runtime, episodes: list[Episode], window: Window, *, window_ends: bool
) -> StepBatch:
    """Scored episodes (and, at the end of a window, its designer samples) -> the step's
    batch: agent samples (zero-advantage ones kept), designer samples first, staleness
    filter, the reference's trim to ``batch_samples`` and its loss normaliser."""
    from spade_async.loop.batcher import (
        agent_batch,
        drop_stale,
        loss_normaliser,
        loss_units,
        trim_batch,
    )

    cfg, st = rt.cfg, rt.state
    agent = agent_batch(episodes, cfg.agent)
    slots: list[Sample | None] = list(agent.slots)
    designer_mean = None
    if cfg.designer_enabled and cfg.designer_train and window_ends and window.samples:
        # the reference's scale counts every actor trajectory of the step (spare_rollout.py:
        # len(actor_samples)), whatever its advantage, and episodes, not fanned-out turns
        from spade_async.loop.batcher import routes_misfit

        misfit = sum(routes_misfit(s.routes_status) for s in window.samples)
        rt.meters.count("routes/dropped", misfit)  # dropped by designer_samples
        stale = sum(s.routes_status == "stale" for s in window.samples)
        rt.meters.count("routes/stale_turns", stale)  # trained without replay
        designer, designer_mean = await designer_batch(rt, window, agent.episodes)
        slots += designer
        window.samples = []  # each window is scored once
    kept, stale = drop_stale(
        [s for s in slots if s is not None],
        version=st.version,
        max_staleness=cfg.max_staleness,
        designer_slack=cfg.regen_interval,
    )
    rt.meters.count("staleness/dropped", stale)
    alive = {id(s) for s in kept}
    slots = [s for s in slots if s is None or id(s) in alive]
    slots, trimmed = trim_batch(slots, cfg.batch_samples)
    rt.meters.count("batch/trimmed", trimmed)
    rt.meters.count("batch/compact_filtered", sum(s is None for s in slots))
    rt.meters.count("routes/dropped", agent.routes_dropped)  # routes that fit no sample
    rt.meters.count("routes/stale_turns", agent.routes_stale)  # a weight update broke them
    normaliser = loss_normaliser(
        loss_units(slots),  # an episode's turn samples count once
        cfg.batch_samples,
        kl_coef=cfg.trainer.kl_coef,
        entropy_coef=cfg.trainer.entropy_coef,
    )
    return StepBatch(
        samples=[s for s in slots if s is not None],
        normaliser=normaliser,
        zero_advantage=agent.zero_advantage,
        designer_mean=designer_mean,
    )


async def learn(
    rt: Runtime,
    episodes: list[Episode],
    window: Window,
    *,
    window_ends: bool,
    pause: bool,
    extra: dict | None = None,
    pushed=None,
) -> None:
    """Everything after play, for both schedules: score -> agent (and, at the end of a
    regeneration window, designer) samples -> staleness filter -> train + push -> log ->
    checkpoint. ``pushed()``, if given, runs as soon as the new version is on the engines
    (the async producer's admission), before the logging."""
    cfg, st = rt.cfg, rt.state
    consumed = list(episodes)  # the journal marks every one consumed by this step
    episodes = audits.drop_quarantined(rt, episodes)  # an audit failed: never trained
    dists = await score(rt, episodes, window if cfg.designer_enabled else None)
    batch = await step_batch(rt, episodes, window, window_ends=window_ends)
    samples, zero_adv, designer_mean = batch.samples, batch.zero_advantage, batch.designer_mean
    await note_trained(rt, consumed, samples, batch.normaliser)  # a resume redoes it
    trained_at = st.version
    train_metrics = await train_and_push(rt, samples, pause=pause, normaliser=batch.normaliser)
    st.step += 1
    if pushed is not None:
        pushed()
    write_transcripts(rt, episodes)
    record = step_record(
        rt,
        episodes,
        samples,
        dists,
        train_metrics,
        zero_adv,
        designer_mean,
        trained_at,
        {**(extra or {}), **await health(rt)},
    )
    rt.tel.log(st.step, record)
    if checkpoint_due(st.step, cfg.checkpoint_every, cfg.max_steps):
        await rt.checkpoint()


def checkpoint_due(step: int, every: int, max_steps: int) -> bool:
    """Every ``every`` steps and at the last one; ``every = 0``: at the last one only."""
    return (every > 0 and step % every == 0) or step == max_steps


async def health(rt: Runtime) -> dict[str, bool]:
    """Engine and trainer health for the dashboard (one /health probe per engine)."""
    status = await rt.client.check_health()
    out = {f"engine/{i}/healthy": status.get(url, False) for i, url in enumerate(rt.engine_urls)}
    out["trainer/healthy"] = rt.trainer_proc.alive() is None
    if getattr(rt.client, "router_url", None):  # engine.router = true
        out["router/healthy"] = status.get(rt.client.router_url, False)
    return out


def step_record(
    rt: Runtime,
    episodes,
    samples,
    dists,
    train_metrics,
    zero_adv,
    designer_mean,
    trained_at: int,
    extra=None,
) -> dict:
    """The metrics record both schedules log after each trainer step (``trained_at``: the
    trainer's version when it took this batch; sample age = trained_at - sample version)."""
    st, cfg = rt.state, rt.cfg
    rt.meters.count("agent/consumed", len(episodes))
    mem = rt.store.stats()  # index counts, no scan
    rewards = [e.reward for e in episodes if not e.hinted]
    return {
        "version": st.version,
        "max_steps": cfg.max_steps,
        **rt.meters.snapshot(),
        **dists,
        "regret/mean": _mean(dists["regret/values"]),
        "reward/agent_mean": _mean(rewards),
        "reward/designer_mean": designer_mean,
        "agent/episodes": len(episodes),
        "agent/zero_advantage": zero_adv,
        "batch/samples": len(samples),
        "batch/max_agent_age": max(
            (trained_at - s.policy_version for s in samples if s.role == "agent"), default=0
        ),
        "batch/versions": sorted({s.policy_version for s in samples}),
        "memory/size": mem["total"],
        "memory/duplicates": mem["duplicates"],
        **{f"train/{k}": v for k, v in train_metrics.items()},
        **(extra or {}),
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
