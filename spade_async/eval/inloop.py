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

__all__ = ["evaluator", "due", "record", "check"]

POLL_S = 1.0


def due(cfg: EvalConfig, version: int, last: int | None) -> bool:
    """Whether ``version`` should be evaluated, given the last evaluated version."""
    if not cfg.interval and not cfg.before_train:
        return False
    if version == last:
        return False
    if version == 0:
        return cfg.before_train
    return cfg.interval > 0 and version % cfg.interval == 0


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
    generate = ClientGenerator(rt.client, rt.tokenizer)
    last: int | None = None
    while not stop.is_set():
        version = rt.state.version
        if due(cfg, version, last):
            last = version
            out = rt.run_dir.root / "eval" / f"v{version}"
            out.mkdir(parents=True, exist_ok=True)
            res = await evaluate(
                list(cfg.suites), generate, out=out, model=rt.cfg.model, n=cfg.n,
                limit=cfg.limit, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency,
                policy_version=version, data=dict(cfg.data),
                overrides=dict(cfg.overrides),
            )  # fmt: skip
            rec = rt.tel.log(rt.state.step, record(res, version, rt.state.version), kind="eval")
            for sink in getattr(rt.tel, "sinks", []):  # TensorBoard / W&B take step records
                sink.write(rec)
        await anyio.sleep(POLL_S)  # versions change once per train step (seconds to minutes)
