"""The sequential schedule: generate, validate, hint, play, score, train, push, repeat."""

from __future__ import annotations

from spade_async.loop import cycle
from spade_async.loop.resume import take_requeued
from spade_async.loop.runtime import Runtime


async def sync_step(rt: Runtime, window: cycle.Window) -> cycle.Window:
    cfg, st = rt.cfg, rt.state
    fresh = False
    if cfg.designer_enabled and (st.step % cfg.regen_interval == 0 or not window.samples):
        window = cycle.Window(samples=await cycle.regenerate(rt, st.version))
        st.current_envs = [s.env_id for s in window.samples if s.env_id]
        fresh = True
    envs = cycle.env_refs(rt, st.current_envs + await cycle.replay(rt, cfg.replay_envs))
    hints = await cycle.window_hints(rt, window, envs, fresh=fresh)
    episodes = take_requeued(rt) + await cycle.play(
        rt, envs, hints, st.version, cycle.plays_per_env(cfg, len(envs))
    )
    window_ends = (st.step + 1) % cfg.regen_interval == 0 or st.step + 1 == cfg.max_steps
    await cycle.learn(rt, episodes, window, window_ends=window_ends, pause=False)
    return window
