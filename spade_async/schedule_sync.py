"""The sequential schedule: generate, validate, hint, play, score, train, push, repeat."""

from __future__ import annotations

from spade_async import cycle
from spade_async.batcher import agent_samples, drop_stale
from spade_async.runtime import Runtime


async def sync_step(rt: Runtime, window: cycle.Window) -> cycle.Window:
    cfg, st = rt.cfg, rt.state
    regen = cfg.designer_enabled and (st.step % cfg.regen_interval == 0 or not window.samples)
    if regen:
        window = cycle.Window(samples=await cycle.regenerate(rt, st.version))
        st.current_envs = [s.env_id for s in window.samples if s.env_id]
    envs = cycle.env_refs(rt, st.current_envs + await cycle.replay(rt, cfg.replay_envs))
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
        samples,
        version=st.version,
        max_staleness=cfg.max_staleness,
        designer_slack=cfg.regen_interval,
    )
    rt.meters.count("staleness/dropped", stale)
    trained_at = st.version
    train_metrics = await cycle.train_and_push(rt, samples, pause=False)
    st.step += 1
    cycle.write_transcripts(rt, episodes)
    rt.tel.log(
        st.step,
        cycle.step_record(
            rt,
            episodes,
            samples,
            dists,
            train_metrics,
            zero_adv,
            designer_mean,
            trained_at,
            await cycle.health(rt),
        ),
    )
    if st.step % cfg.checkpoint_every == 0 or st.step == cfg.max_steps:
        await rt.checkpoint()
    return window
