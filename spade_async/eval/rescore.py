"""``spade eval --responses FILE``: score saved completions again, without generating."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path

import msgspec

from spade_async.envs.pool import EnvPool
from spade_async.errors import SpadeError
from spade_async.eval.checker import Checker
from spade_async.eval.report import load_samples
from spade_async.eval.runner import EVAL_POOL, open_package_pool, summarize, write_samples
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.suites.base import render_prompt_text
from spade_async.eval.types import Results
from spade_async.rundir import write_atomic

__all__ = ["rescore"]


async def _no_generation(*_a, **_k) -> str:
    raise SpadeError("re-scoring never generates")


def _norm(text: str) -> str:
    return " ".join((text or "").split())


def _check_belongs(path: Path, saved: list, items: dict, suite: str) -> None:
    """Every saved line is a problem of ``suite`` with the same problem text (a responses file
    of another suite, or of other data, is one line naming file, line and field)."""
    for n, s in enumerate(saved, 1):
        item = items.get(s.id)
        if item is None:
            raise SpadeError(
                f"{path}:{n}: field 'id' = {s.id!r} is not a problem of suite {suite} "
                f"(is this another suite's responses file?)"
            )
        if s.prompt and _norm(s.prompt) != _norm(render_prompt_text(item.messages)):
            raise SpadeError(
                f"{path}:{n}: field 'prompt' differs from suite {suite}'s problem {s.id!r} "
                f"(another suite's or other data's responses file?)"
            )


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
    _check_belongs(path, saved, items, suite.name)
    with Checker() as checker:
        async with EnvPool(EVAL_POOL) as pool, contextlib.AsyncExitStack() as stack:
            package_pool = await open_package_pool([suite], stack)
            ctx = Context(_no_generation, checker, pool, None, package_pool=package_pool)
            for s in saved:
                s.extracted, s.score = await suite.score(items[s.id], s.completion, ctx)
    counts = Counter(s.id for s in saved)
    # pass@k and maj@k need k samples of every problem: uneven files are scored at the
    # fewest (avg@ stays the mean over every sample), and the result says so
    k = min(counts.values(), default=1)
    settings = msgspec.structs.replace(suite.sampling, n=k)
    version = saved[0].policy_version if saved else None
    result = summarize(suite, saved, settings, f"responses:{path}", version)
    if len(set(counts.values())) > 1:
        spread = Counter(counts.values())
        result.notes.append(
            f"uneven sample counts in {path.name}: "
            + ", ".join(f"{p} problem{'s' * (p != 1)} with {n}" for n, p in sorted(spread.items()))
            + f"; pass@k and maj@k use k = {k} (the fewest), avg@{k} is the mean over all "
            f"{len(saved)} samples"
        )
    res = Results(model=f"responses:{path}", policy_version=version, complete=True,
                  suites={suite.name: result}, seconds=time.perf_counter() - t0)  # fmt: skip
    if out is not None:
        write_samples(out / f"{suite.name}.jsonl", saved)
        write_atomic(out / "results.json", msgspec.json.format(msgspec.json.encode(res)))
    return res
