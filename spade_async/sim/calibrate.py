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
to another run's machine speed: per stage from the CPU probe (``probe_speed``: fixed work
timed on each core around every phase of a ``bench/pipeline.py`` run, while its stages are
idle, so never a timing of the work predicted), or one number from the target's own trainer
(``run_speed``: in sample, shown only to size the drift). The reply length and turn count
are the workload's own (fixed: 2 turns, ``turn_tokens``).
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
    "probe_of",
    "probe_speed",
    "load_of",
    "load_speed",
    "slowdown",
    "contention",
    "engine_contention",
    "with_factor",
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


# Which probe part (bench/_probe.py) paces which stage: the engine runs torch on core 0, the
# trainer (and its push) torch on core 1, the controller and env workers Python on core 0.
PROBE_PARTS = {"engine": ("core0", "torch_s"), "trainer": ("core1", "torch_s"),
               "env": ("core0", "python_s")}  # fmt: skip


def probe_of(saved: str | Path | dict, arm: str, phase: int | None = None) -> dict[str, float]:
    """The CPU probe's mean seconds per stage (``PROBE_PARTS``) around ``arm``'s phases (or
    one ``phase``, 0-based): taken while every stage was idle, never a timing of the work."""
    d = _load(saved)
    points = d[arm].get("probe_points") or []
    if phase is not None:
        points = points[2 * phase : 2 * phase + 2]  # before and after that phase
    if not points:
        w = d["workload"]
        raise ValueError(
            f"the saved {w['name']} run (max_staleness {w['max_staleness']}) has no CPU probe "
            f"for its {arm} arm{'' if phase is None else f' phase {phase}'}: re-run it with "
            "bench/pipeline.py --save (it probes around every phase)"
        )
    return {st: sum(p[c][k] for p in points) / len(points) for st, (c, k) in PROBE_PARTS.items()}


def probe_speed(source: str | Path | dict, target: str | Path | dict, arm: str = "sync",
                phase: int | None = None) -> dict[str, float]:  # fmt: skip
    """How much slower each stage's core ran in ``target``'s ``arm`` (one ``phase``, or all)
    than in ``source``'s sync arm, by the CPU probe alone: the speed a prediction of the
    target may use without any timing of the target's work."""
    s, t = probe_of(source, "sync"), probe_of(target, arm, phase)
    return {k: t[k] / s[k] for k in s}


def load_of(saved: str | Path | dict, arm: str, phase: int | None = None) -> float:
    """The 1-minute load average read at the probe points around ``arm``'s phases (or one
    ``phase``): the machine's runnable tasks over the last minute, ours (1 or 2) included."""
    d = _load(saved)
    points = d[arm].get("probe_points") or []
    if phase is not None:
        points = points[2 * phase : 2 * phase + 2]
    if not points:
        probe_of(d, arm, phase)  # raises, naming the fix
    return sum(p["load_avg_1m"] for p in points) / len(points)


def slowdown(load: float) -> float:
    """How much slower a stage pinned to one of 2 cores runs among ``load`` runnable tasks
    (its own included) than alone: the scheduler's fair share, ``2 / (load + 1)`` of a core
    (the others spread over both cores; the +1 the stage's own), never faster than alone."""
    return max(1.0, (load + 1) / 2)


def load_speed(source: str | Path | dict, target: str | Path | dict, arm: str = "sync",
               phase: int | None = None) -> dict[str, float]:  # fmt: skip
    """``probe_speed``'s counterpart from the load average: the target phase's fair-share
    slowdown over the source's sync arm's, every stage alike."""
    ratio = slowdown(load_of(target, arm, phase)) / slowdown(load_of(source, "sync"))
    return dict.fromkeys(PROBE_PARTS, ratio)


def contention(saved: str | Path | dict, stage: str, by_load: bool = False) -> float:
    """``stage``'s busy time per step in the async arm over the sync arm's (the same work);
    ``by_load``: each arm's first divided by its load slowdown (``slowdown``), so that what
    is left is what overlapping our own stages costs, not the machine's other load."""
    d = _load(saved)

    def per_step(arm: str) -> float:
        t = d[arm]["busy_s"][stage] / d[arm]["steps"]
        return t / slowdown(load_of(d, arm)) if by_load else t

    return per_step("async") / per_step("sync")


def transfer(costs: Costs, source: str | Path | dict, target: str | Path | dict,
             speed: float | dict[str, float] = 1.0) -> Costs:  # fmt: skip
    """``costs`` (measured on ``source``'s workload) carried to ``target``'s workload: the
    environment step is the target's sleep plus the source's measured overhead, the engine's
    per-row part follows the target's rows (the simulated batch), the trainer its trained
    tokens; every measured second scaled by ``speed`` (1.0: the same machine speed; a dict:
    per stage, ``engine``, ``trainer`` (and push), ``env``, as ``probe_speed`` gives)."""
    s, t = _load(source), _load(target)
    ws, wt = s["workload"], t["workload"]
    sp = speed if isinstance(speed, dict) else dict.fromkeys(PROBE_PARTS, float(speed))
    tokens_s = costs.notes.get("train_tokens_per_step") or 1.0
    tokens_t = t["sync"]["trained_tokens"] / t["sync"]["steps"]
    overhead = costs.notes.get("env_overhead_s", 0.0)
    env = float(wt.get("env_step_sleep_s", 0.0)) + overhead * sp["env"]
    said = ", ".join(f"{k} x{v:.3f}" for k, v in sp.items()) if sp != dict.fromkeys(sp, 1.0) else ""
    return replace(
        costs,
        name=f"{ws['name']}'s per-unit costs carried to {wt['name']}"
        + (f", machine speed {said}" if said else ""),
        iter_fixed_s=costs.iter_fixed_s * sp["engine"],  # the per-row part: the target's rows
        iter_per_seq_s=costs.iter_per_seq_s * sp["engine"],
        train_fixed_s=costs.train_fixed_s * tokens_t / tokens_s * sp["trainer"],
        push_s=costs.push_s * sp["trainer"],
        env_step_s=env,
        lengths=replace(
            costs.lengths,
            agent_reply_median=float(wt["turn_tokens"]),
            agent_turns_median=float(wt["turns"]),
        ),  # fmt: skip
        notes={**costs.notes, "speed": sp},
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


# the Costs fields each stage's seconds are in
_STAGE_FIELDS = {
    "engine": ("iter_fixed_s", "iter_per_seq_s"),
    "trainer": ("train_fixed_s", "push_s"),
}


def with_factor(costs: Costs, stage: str, factor: float, why: str) -> Costs:
    """``costs`` with every ``stage`` second (engine: decoding; trainer: training and push)
    scaled by ``factor`` (``why``: its source)."""
    return replace(
        costs,
        name=f"{costs.name}, {stage} x{factor:.3f} ({why})",
        **{f: getattr(costs, f) * factor for f in _STAGE_FIELDS[stage]},
        notes={**costs.notes, f"{stage}_factor": factor, f"{stage}_factor_source": why},
    )
