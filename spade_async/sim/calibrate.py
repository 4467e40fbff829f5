"""Costs measured on this machine: ``bench/pipeline.py``'s saved stage timings.

Each stage's cost is its busy time per trainer step in the arms named (``arms``: both, the
least busy of the two, as the pipeline bench's ideal bound takes it; or the sync arm only,
so that the async wall is predicted from a run that never ran the async schedule):

- engine: busy seconds over the step's decode iterations (every play's turn in one batch:
  the workload's 4 environments x plays rows), split into a fixed part and a per-row part
  with the CPU engine's measured vocab-head slope (``bench/pipeline.py``, ``older_first``:
  15 ms at 32 rows, 25 ms at 64: 0.31 ms a row);
- trainer: train busy per step (every step trains the same samples); push: push busy per step;
- environment step: env-pool busy over the step's turns (a turn's steps run side by side),
  its part above the workload's own ``env_step_sleep_s`` kept apart as overhead.

``transfer`` carries one workload's per-unit costs to another workload (its known
differences: environment sleep, rows, reply length, turns, trained tokens) and, optionally,
to another run's machine speed (``speed``: one number, the ratio of the two runs' stage time
on identical work, see ``run_speed``). The reply length and turn count are the workload's
own (fixed: 2 turns, ``turn_tokens``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from spade_async.sim.costs import Costs, Lengths

__all__ = [
    "cpu_costs",
    "transfer",
    "run_speed",
    "engine_contention",
    "with_engine_factor",
    "ROW_SLOPE_S",
]

ROW_SLOPE_S = (0.025 - 0.015) / 32  # bench/pipeline.py older_first(): vocab head per row


def _load(saved: str | Path | dict) -> dict:
    return saved if isinstance(saved, dict) else json.loads(Path(saved).read_text())


def cpu_costs(saved: str | Path | dict, arms: tuple[str, ...] = ("sync", "async")) -> Costs:
    """``Costs`` for the CPU workload a saved ``bench/pipeline.py`` result ran, from the
    busy times of ``arms`` (the least busy of them, per stage)."""
    d = _load(saved)
    bad = [a for a in arms if a not in ("sync", "async")]
    if bad or not arms:
        raise ValueError(f"arms {arms!r}: 'sync' and/or 'async'")
    w = d["workload"]
    steps = d[arms[0]]["steps"]
    turns, rows = w["turns"], w["envs"] * w["plays"]

    def least(stage: str) -> float:
        return min(d[a]["busy_s"].get(stage, 0.0) / d[a]["steps"] for a in arms)

    iter_s = least("engine") / (turns * w["turn_tokens"])
    push = least("push")
    train = least("trainer") - push
    env_step = least("env_pool") / turns
    return Costs(
        name=f"{w['name']} on this machine ({d['hardware'].get('cpu', '?')}, saved run, "
        f"{'+'.join(arms)} arm{'s' if len(arms) > 1 else ''}, {steps} steps)",
        engines=1,
        iter_fixed_s=max(0.0, iter_s - rows * ROW_SLOPE_S),
        iter_per_seq_s=ROW_SLOPE_S,
        iter_per_ctx_s=0.0,
        prefill_per_token_s=0.0,  # in the iteration cost it was measured with
        kv_capacity_tokens=10**9,
        train_fixed_s=train,  # every step trains the same samples: per step, not per token
        train_per_token_s=0.0,
        train_per_ctx_token_s=0.0,
        push_s=push,
        env_step_s=env_step,
        env_open_s=0.0,
        validate_s=0.0,
        lengths=Lengths(
            agent_reply_median=float(w["turn_tokens"]),
            agent_reply_sigma=0.0,
            agent_turns_median=float(turns),
            agent_turns_sigma=0.0,
            prompt_tokens=64,
            obs_tokens=8,
            source="the workload's own: fixed turns and reply length (bench/pipeline.py)",
        ),
        notes={
            "env_overhead_s": max(0.0, env_step - float(w.get("env_step_sleep_s", 0.0))),
            "train_tokens_per_step": d[arms[0]]["trained_tokens"] / steps,
        },  # fmt: skip
    )


def run_speed(source: str | Path | dict, target: str | Path | dict, stage: str = "trainer",
              arm: str = "sync") -> float:  # fmt: skip
    """How much slower ``target``'s machine ran than ``source``'s: the ratio of one stage's
    busy time per trained token in one arm (the trainer: the same samples, pinned to its own
    core, no environment or controller beside it). A measured number of the target run, not
    a prediction: a prediction that uses it says so."""
    s, t = _load(source), _load(target)

    def per_token(d: dict) -> float:
        return d[arm]["busy_s"][stage] / max(1, d[arm]["trained_tokens"])

    return per_token(t) / per_token(s)


def transfer(costs: Costs, source: str | Path | dict, target: str | Path | dict,
             speed: float = 1.0) -> Costs:  # fmt: skip
    """``costs`` (measured on ``source``'s workload) carried to ``target``'s workload: the
    environment step is the target's sleep plus the source's measured overhead, the engine's
    per-row part follows the target's rows (the simulated batch), the trainer its trained tokens; every measured
    second scaled by ``speed`` (1.0: the same machine speed)."""
    s, t = _load(source), _load(target)
    ws, wt = s["workload"], t["workload"]
    tokens_s = costs.notes.get("train_tokens_per_step") or 1.0
    tokens_t = t["sync"]["trained_tokens"] / t["sync"]["steps"]
    overhead = costs.notes.get("env_overhead_s", 0.0)
    env = float(wt.get("env_step_sleep_s", 0.0)) + overhead * speed
    return replace(
        costs,
        name=f"{ws['name']}'s per-unit costs carried to {wt['name']}"
        + (f", x{speed:.3f} machine speed" if speed != 1.0 else ""),
        iter_fixed_s=costs.iter_fixed_s * speed,  # the per-row part follows the target's rows
        iter_per_seq_s=costs.iter_per_seq_s * speed,
        train_fixed_s=costs.train_fixed_s * tokens_t / tokens_s * speed,
        push_s=costs.push_s * speed,
        env_step_s=env,
        lengths=replace(
            costs.lengths,
            agent_reply_median=float(wt["turn_tokens"]),
            agent_turns_median=float(wt["turns"]),
        ),  # fmt: skip
        notes={**costs.notes, "speed": speed},
    )


def engine_contention(saved: str | Path | dict) -> float:
    """How much slower the engine ran per unit of work under the async schedule than under
    the sync one in a saved run (engine busy, async over sync: the same decode work). On these
    2 cores the CPU engine shares core 0 with the controller and the environment workers,
    whose CPU overlaps decoding only when the stages overlap (async)."""
    d = _load(saved)
    return (d["async"]["busy_s"]["engine"] / d["async"]["steps"]) / (
        d["sync"]["busy_s"]["engine"] / d["sync"]["steps"]
    )


def with_engine_factor(costs: Costs, factor: float, why: str) -> Costs:
    """``costs`` with every engine second scaled by ``factor`` (``why``: its source)."""
    return replace(
        costs,
        name=f"{costs.name}, engine x{factor:.3f} ({why})",
        iter_fixed_s=costs.iter_fixed_s * factor,
        iter_per_seq_s=costs.iter_per_seq_s * factor,
        notes={**costs.notes, "engine_factor": factor, "engine_factor_source": why},
    )
