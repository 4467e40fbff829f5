"""The sequential schedule: generate, validate, hint, play, score, train, push, repeat."""

from __future__ import annotations

from spade_async import cycle
from spade_async.batcher import agent_samples, drop_stale
from spade_async.runtime import Runtime
from spade_async.trainer.batch import Batch


async def sync_step(rt: Runtime, window: cycle.Window) -> cycle.Window:
    cfg, st = rt.cfg, rt.state
    regen = cfg.designer_enabled and (st.step % cfg.regen_interval == 0 or not window.samples)
    if regen:
        window = cycle.Window(samples=await cycle.regenerate(rt, st.version))
        st.current_envs = [s.env_id for s in window.samples if s.env_id]
    envs = cycle.env_refs(rt, st.current_envs + cycle.replay(rt, cfg.replay_envs))
    hints = await cycle.hints_for(rt, envs)
    episodes = await cycle.play(rt, envs, hints, st.version)
    dists = await cycle.score(rt, episodes, window if cfg.designer_enabled else None)
    samples, zero_adv = agent_samples(episodes, cfg.agent)
    n_agent, designer_mean = len(samples), None
    window_ends = (st.step + 1) % cfg.regen_interval == 0 or st.step + 1 == cfg.max_steps
    if cfg.designer_enabled and cfg.designer_train and window_ends and window.samples:
        designer, designer_mean = await cycle.designer_batch(rt, window, n_agent)
        samples += designer
    samples, stale = drop_stale(
        samples, version=st.version, max_staleness=cfg.max_staleness, designer_slack=cfg.regen_interval
    )
    rt.meters.count("staleness/dropped", stale)
    train_metrics: dict[str, float] = {}
    if samples:
        with rt.meters.busy("trainer"):
            train_metrics = await rt.trainer.train_step(Batch(samples=samples))
            pushed = await rt.trainer.push_weights(rt.engine_urls)
        st.version = pushed.version
        rt.meters.add_tokens("trainer", sum(len(s.token_ids) for s in samples))
    else:
        rt.meters.count("train/empty_batches")
    st.step += 1
    cycle.write_transcripts(rt, episodes)
    rewards = [e.reward for e in episodes if not e.hinted]
    rt.tel.log(st.step, {
        "version": st.version, "max_steps": cfg.max_steps, **rt.meters.snapshot(),
        **dists, "regret/mean": _mean(dists["regret/values"]),
        "reward/agent_mean": _mean(rewards), "reward/designer_mean": designer_mean,
        "agent/episodes": len(episodes), "agent/zero_advantage": zero_adv,
        "batch/samples": len(samples), "memory/size": rt.store.stats().get("total", 0),
        **{f"train/{k}": v for k, v in train_metrics.items()},
    })
    if st.step % cfg.checkpoint_every == 0 or st.step == cfg.max_steps:
        await rt.checkpoint()
    return window


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
