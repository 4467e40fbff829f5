"""``spade eval --responses FILE``: score saved completions again, without generating."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import msgspec

from spade_async.envs.pool import EnvPool
from spade_async.errors import SpadeError
from spade_async.eval.checker import Checker
from spade_async.eval.report import load_samples
from spade_async.eval.runner import EVAL_POOL, open_package_pool, summarize, write_samples
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.types import Results, Sampling
from spade_async.rundir import write_atomic

__all__ = ["rescore"]


async def _no_generation(*_a, **_k) -> str:
    raise SpadeError("re-scoring never generates")


async def rescore(path: Path, names: list[str], out: Path | None, data: dict[str, str]) -> Results:
    if len(names) != 1:
        raise SpadeError("--responses re-scores one suite: name it with --suites SUITE")
    suite = make_suite(names[0], data)
    if suite.multi_turn:
        raise SpadeError(
            f"suite {suite.name} is multi-turn: its saved transcripts cannot be re-scored without replaying them (not implemented)"
        )
    t0 = time.perf_counter()
    saved = load_samples(path)
    items = {i.id: i for i in suite.load(0)}
    unknown = sorted({s.id for s in saved} - set(items))
    if unknown:
        raise SpadeError(f"{path}: ids not in suite {suite.name}: {', '.join(unknown[:3])}")
    with Checker() as checker:
        async with EnvPool(EVAL_POOL) as pool, contextlib.AsyncExitStack() as stack:
            package_pool = await open_package_pool([suite], stack)
            ctx = Context(_no_generation, checker, pool, None, package_pool=package_pool)
            for s in saved:
                s.extracted, s.score = await suite.score(items[s.id], s.completion, ctx)
    k = max(1, max((sum(1 for x in saved if x.id == i) for i in {s.id for s in saved}), default=1))
    settings = msgspec.structs.replace(suite.sampling, n=k) if k else Sampling()
    version = saved[0].policy_version if saved else None
    res = Results(model=f"responses:{path}", policy_version=version, complete=True,
                  suites={suite.name: summarize(suite, saved, settings, f"responses:{path}", version)},
                  seconds=time.perf_counter() - t0)  # fmt: skip
    if out is not None:
        write_samples(out / f"{suite.name}.jsonl", saved)
        write_atomic(out / "results.json", msgspec.json.format(msgspec.json.encode(res)))
    return res
