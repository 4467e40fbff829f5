"""The main loop: open the runtime, run the configured schedule to ``max_steps``, checkpoint.

Ctrl-C (or SIGTERM) once: stop starting new work, abort in-flight episodes, checkpoint,
flush memory, exit 0. Twice: kill every child process group and exit at once (130).
"""

from __future__ import annotations

import gc
import os
import signal

import anyio

from spade_async.eval.inloop import evaluator
from spade_async.loop.cycle import Window
from spade_async.loop.resume import replay_journal
from spade_async.loop.runtime import Runtime, open_runtime
from spade_async.recipe import Config
from spade_async.rundir import RunDir

# CPython's collector at its default gen-0 threshold (700 allocations) ran ~30% of the
# controller's CPU at the 8B games scale (bench/simulate.py; the same peak memory with
# these): a step allocates millions of short-lived objects (token lists, the engines'
# per-token log-prob triples) and every young collection walks them.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> tuple[int, int, int]:
    """Collect less often (``GC_THRESHOLDS``); returns the thresholds it replaced."""
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    return old


async def train(cfg: Config, run_dir: RunDir, *, handle_signals: bool = True) -> int:
    gc_was = tune_gc()  # the controller's setting, for this run only (in-process callers)
    try:
        return await _train(cfg, run_dir, handle_signals=handle_signals)
    finally:
        gc.set_threshold(*gc_was)


async def _train(cfg: Config, run_dir: RunDir, *, handle_signals: bool) -> int:
    stop = anyio.Event()
    async with open_runtime(cfg, run_dir) as rt, anyio.create_task_group() as tg:
        if handle_signals:
            tg.start_soon(_signals, rt, stop)
        rt.tel.event(
            rt.state.step, rt.resume_note or f"new run {run_dir.root} ({cfg.schedule} schedule)"
        )
        async with anyio.create_task_group() as work:
            work.start_soon(_abort_after_grace, stop, work.cancel_scope, cfg.shutdown_grace_s)
            work.start_soon(evaluator, rt, stop)  # [eval]: held-out evaluation, engines shared
            await replay_journal(rt, stop)  # a resume: the journal's steps and episodes
            await _schedule(rt, stop)
            work.cancel_scope.cancel()
        if stop.is_set():
            await rt.checkpoint()
            rt.tel.event(
                rt.state.step, f"stopped by signal at step {rt.state.step}; checkpoint saved"
            )
        else:
            rt.tel.event(
                rt.state.step, f"done: {rt.state.step} steps, policy version {rt.state.version}"
            )
        tg.cancel_scope.cancel()
    return 0


async def _schedule(rt: Runtime, stop: anyio.Event) -> None:
    if rt.cfg.schedule == "async" and rt.cfg.deterministic:  # docs/determinism.md
        rt.tel.event(rt.state.step, "deterministic: the async schedule runs its sync equivalent")
    elif rt.cfg.schedule == "async":
        from spade_async.loop.schedule_async import run_async

        await run_async(rt, stop)
        return
    from spade_async.loop.schedule_sync import sync_step

    window = Window()
    while rt.state.step < rt.cfg.max_steps and not stop.is_set():
        window = await sync_step(rt, window)


async def _abort_after_grace(stop: anyio.Event, scope: anyio.CancelScope, grace_s: float) -> None:
    """After a stop request, in-flight work gets ``grace_s`` to finish, then it is aborted."""
    await stop.wait()
    await anyio.sleep(grace_s)
    scope.cancel()


async def _signals(rt: Runtime, stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if not stop.is_set():
                stop.set()
                rt.tel.event(
                    rt.state.step,
                    "stopping: finishing the step, then a checkpoint (Ctrl-C again to quit now)",
                )
                continue
            rt.kill_children()
            os._exit(130)
