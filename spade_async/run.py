"""The main loop: open the runtime, run the configured schedule to ``max_steps``, checkpoint."""

from __future__ import annotations

from spade_async.cycle import Window
from spade_async.recipe import Config
from spade_async.rundir import RunDir
from spade_async.runtime import open_runtime


async def train(cfg: Config, run_dir: RunDir) -> int:
    if cfg.schedule == "async":
        from spade_async.errors import ConfigError

        raise ConfigError("schedule = 'async' is not built yet (issue 7); use schedule = 'sync'")
    from spade_async.schedule_sync import sync_step

    async with open_runtime(cfg, run_dir) as rt:
        rt.tel.event(rt.state.step, f"run {run_dir.root} at step {rt.state.step}, version {rt.state.version}")
        window = Window()
        while rt.state.step < cfg.max_steps:
            window = await sync_step(rt, window)
        rt.tel.event(rt.state.step, f"done: {rt.state.step} steps, policy version {rt.state.version}")
    return 0
