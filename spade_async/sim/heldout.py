"""Out-of-sample validation: predict ``bench/pipeline.py``'s saved walls from costs that
were not measured on the arm or the workload predicted.

Three kinds of prediction, each row with its error:

- ``sync_to_async``: the sync arm's stage timings alone predict the async arm's wall (the
  async arm never enters the costs); ``+contention`` also scales the engine by the
  async-over-sync engine slowdown measured on the *other* saved runs (held out), the one
  effect a sync run cannot show: on 2 cores the CPU engine shares core 0 with the controller
  and environment workers, whose CPU overlaps decoding only when the stages overlap;
- ``cross_workload``: one workload's sync-arm per-unit costs plus the other's known
  differences (environment sleep, rows, tokens; ``calibrate.transfer``) predict the other's
  sync and async walls; ``+speed`` also scales by the two runs' machine speed, one measured
  number of the target run (its trainer seconds per trained token, sync arm);
- the staleness-2 run (``pipeline_three_stage_s2``, an Intel Xeon, older code) is predicted
  like the others and reported.

Each phase is simulated from an empty pipeline, as ``bench/pipeline.py`` measured it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from spade_async.sim.calibrate import (
    cpu_costs,
    engine_contention,
    run_speed,
    transfer,
    with_engine_factor,
)

__all__ = ["RUNS", "load_run", "predict_wall", "heldout_table", "format_heldout"]

RUNS = ("pipeline", "pipeline_three_stage", "pipeline_three_stage_s2")
CROSS = (("pipeline", "pipeline_three_stage"), ("pipeline_three_stage", "pipeline"))


def load_run(root: Path, name: str) -> dict:
    return json.loads((root / "bench" / "results" / f"{name}.json").read_text())


def _cfg(root: Path, saved: dict, schedule: str):
    sys.path.insert(0, str(root / "bench"))
    import pipeline as P  # bench/pipeline.py: the overrides the bench ran

    from spade_async import recipe

    w = saved["workload"]
    three, stale = w["name"] == "three_stage", w["max_staleness"]
    over = P.overrides(root, root, False, P.lookahead_steps(three, stale), stale, 0)
    # the saved runs predate in-training audits (64b942c): predicted without them
    return msgspec.structs.replace(recipe.load(None, [*over, "audit.share=0.0"]), schedule=schedule)


def predict_wall(root: Path, saved: dict, costs, schedule: str) -> dict:
    """One arm's wall predicted: one phase simulated, times the phases measured."""
    from spade_async.sim.runtime import simulate

    m = saved[schedule]
    sim = simulate(_cfg(root, saved, schedule), costs, m["steps"] // m["phases"])
    predicted = sim["wall_s"] * m["phases"]
    return {"measured_wall_s": m["wall_s"], "predicted_wall_s": round(predicted, 2),
            "error": round(predicted / m["wall_s"] - 1, 3),
            "max_sample_age": sim["max_sample_age"]}  # fmt: skip


def heldout_table(root: Path) -> list[dict]:
    runs = {n: load_run(root, n) for n in RUNS}
    rows = []
    for name, d in runs.items():
        w = d["workload"]
        label = f"{w['name']} s{w['max_staleness']} ({d['hardware'].get('cpu', '?')})"
        sync_only = cpu_costs(d, ("sync",))
        others = [engine_contention(runs[o]) for o in runs if o != name]
        factor = sum(others) / len(others)
        held = with_engine_factor(sync_only, factor, "async/sync engine slowdown, other runs")
        for kind, costs in (("sync_to_async", sync_only), ("sync_to_async+contention", held)):
            rows.append({"kind": kind, "run": name, "label": label, "arm": "async",
                         "costs_from": f"{name} sync arm", **predict_wall(root, d, costs, "async"),
                         **({"engine_factor": round(factor, 3)} if "+" in kind else {})})  # fmt: skip
        rows[-1]["engine_factor_in_sample"] = round(engine_contention(d), 3)
    for src, dst in CROSS:
        s, t = runs[src], runs[dst]
        base = cpu_costs(s, ("sync",))
        speed = run_speed(s, t)
        factor = engine_contention(s)  # the source's own: the target's async arm held out
        for kind, sp in (("cross_workload", 1.0), ("cross_workload+speed", speed)):
            costs = transfer(base, s, t, sp)
            for arm in ("sync", "async"):
                c = costs if arm == "sync" else with_engine_factor(costs, factor, f"{src} run")
                rows.append({"kind": kind, "run": dst, "arm": arm,
                             "label": f"{s['workload']['name']} -> {t['workload']['name']}",
                             "costs_from": f"{src} sync arm" + (f", speed x{sp:.3f}" if sp != 1
                                                                else ""),
                             **predict_wall(root, t, c, arm)})  # fmt: skip
    return rows


def format_heldout(rows: list[dict]) -> str:
    head = (
        f"{'prediction':<26} {'run':<34} {'arm':<6} {'measured':>9} {'predicted':>9} {'error':>7}"
    )
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['kind']:<26} {r['label'][:34]:<34} {r['arm']:<6} "
                   f"{r['measured_wall_s']:>9.1f} {r['predicted_wall_s']:>9.1f} "
                   f"{r['error']:>+7.1%}")  # fmt: skip
    return "\n".join(out)
