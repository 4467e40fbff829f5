"""Evaluation inside a training run (``[eval]`` in the recipe), sharing the engines.

One task in the run's task group watches the policy version; at ``before_train`` (version
0) and every ``interval`` versions it evaluates the configured suites through the run's own
generation client, concurrently with training generation (the engines batch both; training
is never paused for it). Code and tool-use episodes get a sandbox pool of their own, not
training's: training episodes can hold every worker of that one, and an evaluation episode
that waited past its capacity wait would score 0. Each evaluation is tagged with the policy
version it started on; a weight push during it is recorded (``eval/policy_version_end``),
since its later samples then come from the next policy. Results go to
``runs/<name>/eval/v<version>/`` (results.json, <suite>.jsonl) and to metrics.jsonl as a
``kind = "eval"`` record with keys ``eval/<suite>/<metric>`` (also sent to the TensorBoard
and W&B sinks, at the training step when the evaluation ended).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from spade_async.eval.checks import check
from spade_async.eval.engine import ClientGenerator
from spade_async.eval.runner import evaluate
from spade_async.eval.types import EvalConfig, Results

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime

__all__ = ["evaluator", "due", "late", "record", "check"]

POLL_S = 1.0


def due(cfg: EvalConfig, version: int, last: int | None) -> bool:
    """Whether ``version`` should be evaluated, given the last evaluated version: version 0
    with ``before_train``; later, when an interval boundary lies in ``(last, version]``. A
    boundary that passed while an evaluation was running (or between two polls) is thus
    evaluated late, at the version the loop finds, never skipped (``late`` says which)."""
    if version == last:
        return False
    if version == 0:
        return cfg.before_train
    if cfg.interval <= 0:
        return False
    return version // cfg.interval > (last or 0) // cfg.interval


def late(cfg: EvalConfig, version: int, last: int | None) -> list[int]:
    """The interval boundaries in ``(last, version)`` that ``version`` is evaluated for
    instead (empty when ``version`` is itself the boundary it was due at)."""
    if cfg.interval <= 0 or version == 0:
        return []
    first = (last or 0) // cfg.interval + 1
    return [b * cfg.interval for b in range(first, version // cfg.interval + 1)
            if b * cfg.interval != version]  # fmt: skip


def record(res: Results, start: int, end: int) -> dict[str, Any]:
    """The metrics.jsonl values of one evaluation."""
    values: dict[str, Any] = {"eval/policy_version": start, "eval/policy_version_end": end,
                              "eval/seconds": round(res.seconds, 3)}  # fmt: skip
    for name, r in res.suites.items():
        for metric, value in r.metrics.items():
            values[f"eval/{name}/{metric}"] = value
    return values


async def evaluator(rt: Runtime, stop: anyio.Event) -> None:
    """Run for the whole training run; evaluate whenever ``due``."""
    cfg: EvalConfig = rt.cfg.eval
    if not cfg.interval and not cfg.before_train:
        return
    # a resumed run: boundaries before its first version were the earlier process's
    last: int | None = rt.state.version - 1 if rt.state.version > 0 else None
    while not stop.is_set():
        version = rt.state.version
        if due(cfg, version, last):
            passed = late(cfg, version, last)
            if passed:  # said once, in the log and metrics.jsonl, never silently skipped
                rt.tel.log(rt.state.step, {"level": "warning", "message": (
                    f"eval: interval boundary {', '.join(f'v{b}' for b in passed)} passed while "
                    f"the previous evaluation ran; evaluating v{version} for it (eval/due_version)"
                )}, kind="event")  # fmt: skip
            last = version
            out = rt.run_dir.root / "eval" / f"v{version}"
            out.mkdir(parents=True, exist_ok=True)
            # one generator per evaluation: every version is sampled with the same seeds
            generate = ClientGenerator(rt.client, rt.tokenizer, seed=rt.cfg.seed)
            res = await evaluate(
                list(cfg.suites), generate, out=out, model=rt.cfg.model, n=cfg.n,
                limit=cfg.limit, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency,
                policy_version=version, data=dict(cfg.data),
                overrides=dict(cfg.overrides),
            )  # fmt: skip
            values = record(res, version, rt.state.version)
            if passed:
                values |= {"eval/due_version": passed[-1], "eval/boundaries_folded": len(passed)}
            rec = rt.tel.log(rt.state.step, values, kind="eval")
            for sink in getattr(rt.tel, "sinks", []):  # TensorBoard / W&B take step records
                sink.write(rec)
        await anyio.sleep(POLL_S)  # versions change once per train step (seconds to minutes)
