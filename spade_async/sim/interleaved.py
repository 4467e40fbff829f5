"""Held-out predictions of an interleaved bench (``bench/heldout_interleaved.py``): drift
removed by design instead of modelled.

The bench runs, in one invocation, short phases of both workloads (``two_stage``,
``three_stage``) under both schedules, round after round, the order rotated each round, so
that the shared machine's slow drift hits every arm alike. Each phase of a round is then
predicted from *other* phases only, with ``sim/heldout.py``'s own functions:

- ``sync_to_async``: a workload's async phase of round r from its own sync phases of the
  adjacent rounds (r-1, r, r+1, those that exist); ``+contention`` also scales the engine by
  the async-over-sync engine slowdown of the same workload's *other* rounds (``async_costs``
  with those rounds as its "other runs");
- ``round`` "all" (pooled): the same predictions over the whole run, a workload's phases
  of every round together (the contention: the other workload's), as the separate saved
  runs were predicted, but with the drift spread over both arms alike;
- ``cross_workload``: a workload's sync and async phase of round r from the *other*
  workload's sync phases of the adjacent rounds, carried with this workload's known
  differences (``cross_costs``: ``transfer``, the source's own engine contention). Its
  in-sample ``+speed`` kind (a timing of the predicted phase) is left out.

Nothing of the predicted phase enters its costs but its workload, its steps and its trained
tokens (the workload's known size); ``tests/unit/test_interleaved.py`` poisons its timings.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from spade_async.sim.heldout import async_costs, cross_costs, predict_wall

__all__ = [
    "pseudo_run",
    "interleaved_costs",
    "interleaved_rows",
    "interleaved_summary",
    "env_diagnosis",
    "KINDS",
]

KINDS = ("sync_to_async", "sync_to_async+contention", "cross_workload")


def _arm(phases: list[dict]) -> dict:
    """Phases of one workload and schedule as one arm of a saved ``bench/pipeline.py`` run."""
    stages = sorted({k for p in phases for k in p["busy_s"]})
    return {
        "phases": len(phases),
        "steps": sum(p["steps"] for p in phases),
        "wall_s": round(sum(p["wall_s"] for p in phases), 2),
        "wall_s_per_phase": [p["wall_s"] for p in phases],
        "busy_s": {k: sum(p["busy_s"].get(k, 0.0) for p in phases) for k in stages},
        "busy_s_per_phase": [dict(p["busy_s"]) for p in phases],
        "trained_tokens": sum(p["trained_tokens"] for p in phases),
        "trained_samples": sum(p["trained_samples"] for p in phases),
        "controller_cpu_s": sum(p["controller_cpu_s"] for p in phases),
        "max_sample_age": max(p["max_sample_age"] for p in phases),
    }


def pseudo_run(saved: dict, workload: str, sync_rounds, async_rounds) -> dict:
    """The interleaved run's phases of ``workload`` as a saved ``bench/pipeline.py`` run:
    its sync arm the sync phases of ``sync_rounds``, its async arm those of ``async_rounds``."""

    def of(schedule: str, rounds) -> list[dict]:
        got = [p for p in saved["phases"] if p["workload"] == workload
               and p["schedule"] == schedule and p["round"] in set(rounds)]  # fmt: skip
        if not got:
            raise ValueError(f"no {workload} {schedule} phase in rounds {sorted(rounds)}")
        return got

    return {"workload": saved["workloads"][workload], "hardware": saved["hardware"],
            "quick": saved["quick"], "sync": _arm(of("sync", sync_rounds)),
            "async": _arm(of("async", async_rounds))}  # fmt: skip


def _load(saved: dict, r: int, workload: str) -> list[float]:
    return [x for p in saved["phases"] if p["round"] == r and p["workload"] == workload
            for x in p["load_avg_1m"]]  # fmt: skip


def interleaved_costs(saved: dict) -> list[tuple[dict, object, dict]]:
    """Every prediction of every round: ``(row fields, Costs, the run it predicts)``, the
    run a ``pseudo_run`` whose measured arm (``row["arm"]``) is the predicted phase alone."""
    rounds = saved["rounds"]
    names = list(saved["workloads"])
    out: list[tuple[dict, object, dict]] = []
    for r in range(rounds):
        adj = [q for q in (r - 1, r, r + 1) if 0 <= q < rounds]
        for w in names:
            load = _load(saved, r, w)
            lo, hi = min(load), max(load)
            common = {"round": r, "workload": w, "interleaved": True, "run": f"{w} round {r}",
                      "label": f"interleaved r{r} {w} L{lo:.1f}-{hi:.1f}",
                      "load_avg_1m": [lo, hi]}  # fmt: skip
            target = pseudo_run(saved, w, adj, [r])
            # the same workload's other rounds give the contention (their own sync and async)
            others = {f"{w}_r{q}": pseudo_run(saved, w, [q], [q]) for q in adj if q != r}
            if not others:  # one round: the other workload's, still not the predicted phase
                o = next(n for n in names if n != w)
                others = {f"{o}_r{r}": pseudo_run(saved, o, [r], [r])}
            dst = pseudo_run(saved, w, [r], [r])
            sources = {o: pseudo_run(saved, o, adj, adj) for o in names if o != w}
            out += _predictions(common, w, target, others, dst, sources, f"rounds {adj}")
    out += _pooled(saved, names, list(range(rounds)))
    return out


def _pooled(saved: dict, names: list[str], every: list[int]) -> list[tuple[dict, object, dict]]:
    """The whole run (``round`` "all"): a workload's async phases of every round from its sync
    phases of every round (the engine contention: the other workload's, whole run), and each
    workload's arms from the other's sync phases; every phase simulated from empty, summed."""
    out: list[tuple[dict, object, dict]] = []
    for w in names:
        load = [x for r in every for x in _load(saved, r, w)]
        common = {"round": "all", "workload": w, "interleaved": True, "run": f"{w} all rounds",
                  "label": f"interleaved all {w} L{min(load):.1f}-{max(load):.1f}",
                  "load_avg_1m": [min(load), max(load)]}  # fmt: skip
        target = pseudo_run(saved, w, every, every)
        others = {o: pseudo_run(saved, o, every, every) for o in names if o != w}
        out += _predictions(common, w, target, others, target, others, "every round")
    return out


def _predictions(common: dict, w: str, target: dict, others: dict, dst: dict, sources: dict,
                 where: str) -> list[tuple[dict, object, dict]]:  # fmt: skip
    """``w``'s async arm of ``target`` from its sync arm (``+contention``: the engine slowdown
    of ``others``), and ``dst``'s arms from each of ``sources``' sync arms."""
    held = async_costs({"target": target, **others}, "target")
    factor = held.pop("factor")
    out = []
    for kind in ("sync_to_async", "sync_to_async+contention"):
        said = f"; engine x{factor:.3f} from {sorted(others)}" if "+" in kind else ""
        out.append(({"kind": kind, "arm": "async", **common,
                     "costs_from": f"{w} sync phases, {where}{said}"},
                    held[kind][0], target))  # fmt: skip
    for o, src in sources.items():
        for arm, costs in cross_costs(src, dst, o)["cross_workload"].items():
            out.append(({"kind": "cross_workload", "arm": arm, **common, "source": o,
                         "costs_from": f"{o} sync phases, {where}"},
                        costs[0], dst))  # fmt: skip
    return out


def interleaved_rows(root: Path, saved: dict) -> list[dict]:
    """Every round's predictions (``KINDS``): each simulated (``predict_wall``) and set
    against the phase measured, with the load average around that round's phases."""
    return [{**meta, **predict_wall(root, run, costs, meta["arm"])}
            for meta, costs, run in interleaved_costs(saved)]  # fmt: skip


def interleaved_summary(rows: list[dict]) -> dict:
    """Per kind: every round's error, their mean |error| and max |error|; the whole run's
    (``pooled``: each workload's phases of every round together) worst |error|."""
    out = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind and r["round"] != "all"]
        pooled = [r for r in rows if r["kind"] == kind and r["round"] == "all"]
        if not mine:
            continue
        errs = [abs(r["error"]) for r in mine]
        out[kind] = {
            "pooled": [{"workload": r["workload"], "arm": r["arm"], "error": r["error"],
                        "measured_wall_s": r["measured_wall_s"],
                        "predicted_wall_s": r["predicted_wall_s"]} for r in pooled],
            "pooled_max_abs": round(max(abs(r["error"]) for r in pooled), 3) if pooled else None,
            "errors": [{"round": r["round"], "workload": r["workload"], "arm": r["arm"],
                        "error": r["error"], "load_avg_1m": r["load_avg_1m"]} for r in mine],
            "mean_abs": round(statistics.fmean(errs), 3),
            "max_abs": round(max(errs), 3),
        }  # fmt: skip
    return out


def env_diagnosis(root: Path, saved: dict) -> list[dict]:
    """Why a pooled cross-workload sync row misses (a diagnosis, not a prediction: it uses
    the target's own environment cost, in sample). ``calibrate.cpu_costs`` takes the
    environment step from the pool's busy span per turn, and ``transfer`` carries the
    source's span less its sleep as a per-call overhead; where the source's calls sleep, the
    span also holds the spread of the plays' generation ends, which a workload without sleep
    does not pay. Per pair: the carried overhead, the target's own, and the target's sync
    wall with each."""
    from dataclasses import replace

    from spade_async.sim.calibrate import cpu_costs

    names = list(saved["workloads"])
    every = list(range(saved["rounds"]))
    out = []
    for w in names:
        target = pseudo_run(saved, w, every, every)
        own = cpu_costs(target, ("sync",)).notes["env_overhead_s"]
        for o in (n for n in names if n != w):
            carried = cross_costs(pseudo_run(saved, o, every, every), target, o)
            costs = carried["cross_workload"]["sync"][0]
            as_own = replace(
                costs, env_step_s=costs.env_step_s - costs.notes["env_overhead_s"] + own
            )
            out.append({
                "workload": w, "source": o, "arm": "sync",
                "env_overhead_carried_s": round(costs.notes["env_overhead_s"], 4),
                "env_overhead_own_s": round(own, 4),
                "error_carried": predict_wall(root, target, costs, "sync")["error"],
                "error_with_own_env_overhead": predict_wall(root, target, as_own, "sync")["error"],
            })  # fmt: skip
    return out
