"""Run the project's own loop on simulated parts, in virtual time.

``simulate(cfg, costs, steps)`` builds a ``loop.runtime.Runtime`` as ``open_runtime`` does,
but with ``SimClient``/``SimPool``/``SimTrainer`` (and the real memory store, writer,
telemetry, run directory and meters, the meters on the virtual clock), then calls the loop's
own schedule (``loop.run._schedule``: ``schedule_sync.sync_step`` or
``schedule_async.run_async``) for ``steps`` trainer steps on a ``VirtualLoop``. What it
returns: virtual wall and per-stage busy time, the engines' own busy time, the step records'
staleness and version metrics, the largest queue depth seen, and the controller's real CPU
time and peak memory.
"""

from __future__ import annotations

import gc
import resource
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
import numpy as np

from spade_async.loop.runtime import ControllerState, Runtime
from spade_async.memory.records import Origin, make_record
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter
from spade_async.rundir import RunDir
from spade_async.sim.clock import run_virtual
from spade_async.sim.costs import Costs
from spade_async.sim.engine import SIM_CPU, SimClient, SimEngine
from spade_async.sim.parts import SimPool, SimProc, SimTokenizer, SimTrainer
from spade_async.telemetry.metrics import Meters, Telemetry, read_metrics

__all__ = ["simulate"]


async def _inline(fn, *args):
    return fn(*args)


def _pool_code(i: int) -> str:
    return f"class SimPoolEnv{i}:\n    uid = {i}\n"


async def _run(cfg, costs: Costs, root: Path, seed: int, tokenizer=None, until=None) -> dict:
    run_dir = RunDir(root / "run").create()
    rng = np.random.default_rng(seed)
    store = MemoryStore(run_dir.memory, cfg.memory)
    writer = MemoryWriter(store, offload=_inline)
    engines = [
        SimEngine(f"http://sim-engine-{i}", costs, max_running=cfg.engine.max_running_requests,
                  priority=cfg.engine.priority_scheduling)
        for i in range(costs.engines)
    ]  # fmt: skip
    client = SimClient(engines, cfg.client, cfg, rng)
    tool_use = cfg.designer.setting == "tool_use"
    pool = SimPool(costs, cfg.envs.max_workers, rng, tool_use=tool_use)
    trainer = SimTrainer(costs, engines)
    depth = {"groups": 0, "memory_writes": 0}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            for e in engines:
                tg.start_soon(e.run)
            if cfg.fixed_pool or cfg.mode == "fixed_pool":  # the pool the recipe plays
                for i in range(max(1, cfg.replay_envs)):
                    await writer.put(make_record(
                        _pool_code(i), origin=Origin(kind="pool"), valid=True, stage="ok", skill="pool",
                        setting=cfg.designer.setting, multi_turn=True))  # fmt: skip
            with Telemetry(run_dir.root, cfg.telemetry) as tel:
                rt = Runtime(
                    cfg=cfg, run_dir=run_dir, tokenizer=tokenizer or SimTokenizer(), client=client,
                    pool=pool, store=store, writer=writer, corpus=None, trainer=trainer,
                    trainer_proc=SimProc(), tel=tel, engine_urls=list(client.urls),
                    state=ControllerState(), meters=Meters(clock=anyio.current_time),
                    rng=np.random.default_rng(seed + 1),
                    release_memory=cfg.placement.colocate and cfg.placement.release_memory,
                )  # fmt: skip
                from spade_async.loop.run import _schedule, tune_gc

                gc_was = tune_gc()  # as loop.run.train sets it
                stop = anyio.Event()
                if until is not None:  # sees every step record; the loop stops as on a signal
                    tel.sinks.append(_Until(until, stop))
                SIM_CPU[0] = 0.0
                cpu0, t0 = time.process_time(), anyio.current_time()
                async with anyio.create_task_group() as watch:
                    watch.start_soon(_watch_depth, writer, depth)
                    await _schedule(rt, stop)
                    watch.cancel_scope.cancel()
                cpu, wall = time.process_time() - cpu0, anyio.current_time() - t0
                sim_cpu = SIM_CPU[0]
                gc.set_threshold(*gc_was)
                busy = rt.meters.state_dict()["busy_s"]
            writer.close()
            tg.cancel_scope.cancel()
    finally:
        store.close()
    records = [r for r in read_metrics(run_dir.metrics) if r.get("kind") == "step"]
    return {
        "steps": rt.state.step,
        "version": rt.state.version,
        "wall_s": wall,
        "busy_s": busy,
        "engine_busy_share": sum(e.busy_s for e in engines) / max(1e-9, wall * len(engines)),
        "trainer_busy_share": trainer.busy_s / max(1e-9, wall),
        "decoded_tokens": sum(e.decoded for e in engines),
        "engine_mean_batch": sum(e.batch_s for e in engines)
        / max(1e-9, sum(e.busy_s for e in engines)),
        "trained_samples": int(sum(r.get("train/samples", 0) for r in records)),
        "trained_tokens": int(sum(r.get("train/tokens", 0) for r in records)),
        "max_sample_age": max((r.get("batch/max_agent_age", 0) for r in records), default=0),
        "versions": [r.get("version") for r in records],
        "step_times": [r.get("time/elapsed_s", 0.0) for r in records],
        # the designer's cumulative count at each step: where it grows, a window started
        "designed": [int(r.get("designer/generated") or 0) for r in records],
        "samples_per_step": [int(r.get("train/samples", 0)) for r in records],
        "max_ages": [r.get("batch/max_agent_age", 0) for r in records],
        "staleness_dropped": records[-1].get("staleness/dropped", 0) if records else 0,
        "max_groups_buffered": max((r.get("stream/groups/fill", 0) for r in records), default=0),
        "max_memory_queue": depth["memory_writes"],
        "episodes": records[-1].get("agent/consumed", 0) if records else 0,
        "controller_cpu_s": cpu - sim_cpu,  # the loop's own (process CPU less the engines')
        "process_cpu_s": cpu,
    }


class _Until:
    """A telemetry sink: each step record's virtual time and the designer's cumulative count
    go to ``until(step_times, designed)``; when it answers True the loop is asked to stop (it
    finishes the step it is in, as on SIGINT). The steps before are those of a longer run:
    nothing in a step looks at what follows."""

    def __init__(self, until, stop: anyio.Event) -> None:
        self.until, self.stop, self.times, self.designed = until, stop, [], []

    def write(self, record: dict) -> None:
        self.times.append(record.get("time/elapsed_s", 0.0))
        self.designed.append(int(record.get("designer/generated") or 0))
        if not self.stop.is_set() and self.until(list(self.times), list(self.designed)):
            self.stop.set()

    def close(self) -> None:
        return None


async def _watch_depth(writer: MemoryWriter, depth: dict) -> None:
    while True:
        depth["memory_writes"] = max(depth["memory_writes"], writer.depth)
        await anyio.sleep(1.0)


def simulate(cfg, costs: Costs, steps: int, *, seed: int = 0, tokenizer=None,
             until=None) -> dict:  # fmt: skip
    """``steps`` trainer steps of ``cfg``'s schedule on simulated parts (see module doc);
    ``tokenizer``: a real Hugging Face tokenizer to put in the controller's path
    (``parts.RealTokenizerInPath``), else ``parts.SimTokenizer``; ``until(step_times,
    designed)``: called after every step with the virtual times so far and the designer's
    cumulative count at each, True stops the run there (fewer than ``steps``). The same ``cfg``, costs and seed give the same figures, run to run
    (virtual time only; ``tests/unit/test_sim_repeatable.py``)."""
    if tokenizer is not None:
        from spade_async.sim.parts import RealTokenizerInPath

        tokenizer = RealTokenizerInPath(tokenizer)
    cfg = msgspec.structs.replace(
        cfg,
        max_steps=steps,
        telemetry=msgspec.structs.replace(cfg.telemetry, dashboard="off"),
    )
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory(prefix="spade-sim-") as tmp:
        out = run_virtual(_run, cfg, costs, Path(tmp), seed, tokenizer, until)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["rss_growth_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    return out
