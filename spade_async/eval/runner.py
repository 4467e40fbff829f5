"""Play suites concurrently and write ``<suite>.jsonl`` + ``results.json`` (atomically, last).

    results = await evaluate(["aime25"], generate, out=Path("eval"), n=1, limit=2)

Every (problem, sample) is one task in a task group, bounded by ``concurrency``; the engine
batches them. A suite's JSONL is written when the suite finishes; ``results.json`` only
when every suite has, through a temporary file and a rename, so a crash never leaves a
partial ``results.json`` looking complete.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.eval.checker import Checker
from spade_async.eval.suites import Context, Generator, Suite, make_suite
from spade_async.eval.types import Item, Results, Sample, Sampling, SuiteResult
from spade_async.rundir import write_atomic

__all__ = ["evaluate", "settings_for", "write_samples", "summarize", "EVAL_POOL",
           "open_package_pool", "open_episode_pools"]  # fmt: skip

# one fresh worker per code sample / BFCL episode; the call timeout is the per-test timeout
EVAL_POOL = PoolConfig(max_workers=8, prewarm=2, call_timeout_s=10.0, open_timeout_s=30.0)
PACKAGE_WORKERS = 4  # workers of the package pool (reasoning-gym: one per episode)


async def open_package_pool(
    suites: list[Suite], stack: contextlib.AsyncExitStack
) -> EnvPool | None:
    """A pool for the suites whose environments import installed packages (reasoning-gym),
    or None: apart from the pool of code and tool-use episodes, which stays standard library
    only, so model-written code meets the same sandbox whichever suites run beside it."""
    packages = tuple(sorted({p for s in suites for p in s.packages}))
    if not packages:
        return None
    cfg = msgspec.structs.replace(
        EVAL_POOL, packages=packages, max_workers=PACKAGE_WORKERS, memory_mb=2048
    )
    return await stack.enter_async_context(EnvPool(cfg))


async def open_episode_pools(
    suites: list[Suite], stack: contextlib.AsyncExitStack
) -> dict[str, tuple[EnvPool, anyio.CapacityLimiter]]:
    """A pool per suite whose episodes import a library (``Suite.episode_packages``: BFCL's
    multi-turn episodes run bfcl-eval's executor and checker), with a slot per worker: an
    episode holds its worker for the whole dialogue, so none waits into 'busy'."""
    out = {}
    for s in suites:
        if s.episode_packages:
            cfg = msgspec.structs.replace(EVAL_POOL, packages=tuple(s.episode_packages),
                                          memory_mb=2048, prewarm=0)  # fmt: skip
            pool = await stack.enter_async_context(EnvPool(cfg))
            out[s.name] = (pool, anyio.CapacityLimiter(cfg.max_workers))
    return out


def settings_for(
    suite: Suite, *, n: int = 0, max_tokens: int = 0, extra: dict[str, Any] | None = None
) -> Sampling:
    """The suite's reference defaults, then ``n``/``max_tokens`` (all suites), then ``extra``
    (this suite's own overrides win)."""
    s = suite.sampling
    ints = {"n", "top_k", "max_tokens"}
    changes: dict[str, Any] = {}
    if n:
        changes["n"] = n
    if max_tokens:
        changes["max_tokens"] = max_tokens
    changes |= {k: int(v) if k in ints else v for k, v in (extra or {}).items()}
    return msgspec.structs.replace(s, **changes)


def summarize(suite: Suite, samples: list[Sample], settings: Sampling, model: str,
              policy_version: int | None) -> SuiteResult:  # fmt: skip
    k = settings.n
    return SuiteResult(
        suite=suite.name, metrics=suite.metrics(samples, k),
        n_problems=len({s.id for s in samples}), samples=len(samples), k=k, settings=settings,
        model=model, policy_version=policy_version, notes=list(getattr(suite, "notes", [])),
    )  # fmt: skip


def write_samples(path: Path, samples: list[Sample]) -> None:
    ordered = sorted(samples, key=lambda s: (s.id, s.sample))
    write_atomic(path, b"".join(msgspec.json.encode(s) + b"\n" for s in ordered))


async def _play_suite(suite: Suite, items: list[Item], settings: Sampling, ctx: Context,
                      limiter: anyio.CapacityLimiter) -> list[Sample]:  # fmt: skip
    out: list[Sample] = []

    async def one(item: Item, k: int) -> None:
        async with limiter:
            out.append(await suite.play(item, k, settings, ctx))

    async with anyio.create_task_group() as tg:
        for item in items:
            for k in range(settings.n):
                tg.start_soon(one, item, k)
    return out


async def evaluate(
    names: list[str],
    generate: Generator,
    *,
    out: Path | None,
    model: str,
    n: int = 0,
    limit: int = 0,
    max_tokens: int = 0,
    concurrency: int = 32,
    data: dict[str, str] | None = None,
    policy_version: int | None = None,
    pool: EnvPool | None = None,
    checker: Checker | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Results:
    """Evaluate ``names``; every suite's data is loaded first, so bad input fails fast."""
    t0 = time.perf_counter()
    suites = [make_suite(name, data) for name in names]
    if out is not None:  # an earlier run's results.json must not pass for this one's
        (out / "results.json").unlink(missing_ok=True)
    loaded: list[tuple[Suite, list[Item]]] = [(s, []) for s in suites]

    async def load(i: int) -> None:  # loaders spawn processes or read files: overlap them
        loaded[i] = (suites[i], await anyio.to_thread.run_sync(suites[i].load, limit))

    async with anyio.create_task_group() as tg:
        for i in range(len(suites)):
            tg.start_soon(load, i)
    results: dict[str, SuiteResult] = {}
    limiter = anyio.CapacityLimiter(concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if checker is None:
            checker = stack.enter_context(Checker())
        if pool is None and any(s.needs_pool for s in suites):
            pool = await stack.enter_async_context(EnvPool(EVAL_POOL))
        ctx = Context(generate, checker, pool, policy_version,
                      package_pool=await open_package_pool(suites, stack),
                      episode_pools=await open_episode_pools(suites, stack))  # fmt: skip

        async def run_suite(suite: Suite, items: list[Item]) -> None:
            extra = (overrides or {}).get(suite.name)
            settings = settings_for(suite, n=n, max_tokens=max_tokens, extra=extra)
            samples = await _play_suite(suite, items, settings, ctx, limiter)
            if out is not None:
                write_samples(out / f"{suite.name}.jsonl", samples)
            results[suite.name] = summarize(suite, samples, settings, model, policy_version)

        async with anyio.create_task_group() as tg:  # suites share the concurrency bound
            for suite, items in loaded:
                tg.start_soon(run_suite, suite, items)
    results = {s.name: results[s.name] for s in suites}  # the order asked for
    res = Results(model=model, policy_version=policy_version, complete=True, suites=results,
                  seconds=time.perf_counter() - t0)  # fmt: skip
    if out is not None:
        write_atomic(out / "results.json", msgspec.json.format(msgspec.json.encode(res)))
    return res
