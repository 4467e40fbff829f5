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
  sync and async walls; ``+probe`` also scales each stage by its core's speed in each
  phase of the target run over the source's sync arm, measured by the CPU probe
  (``bench/_probe.py``: fixed work timed while every stage is idle, before and after each
  phase) and never by the target's work; ``+speed`` scales by the target's own trainer
  seconds per trained token (``in_sample``: a timing of the work predicted, shown only to
  say how much of the error is machine speed);
- the staleness-2 run (``pipeline_three_stage_s2``, an Intel Xeon, older code) is predicted
  like the others and reported;
- the interleaved bench (``INTERLEAVED``, ``bench/heldout_interleaved.py``: both workloads
  and schedules in one invocation, phases interleaved round by round), predicted by
  ``sim/interleaved.py`` with these functions; where saved, the targets' ``met`` reads it.

Each phase is simulated from an empty pipeline, as ``bench/pipeline.py`` measured it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from spade_async.sim.calibrate import (
    contention,
    cpu_costs,
    engine_contention,
    load_of,
    load_speed,
    probe_speed,
    run_speed,
    transfer,
    with_factor,
)

__all__ = ["RUNS", "INTERLEAVED", "load_run", "predict_wall", "predict_phases", "async_costs", "cross_costs",
           "cross_rows", "heldout_table",
           "format_heldout", "heldout_targets", "worst", "short"]  # fmt: skip

# the quiet runs (load < 1.1, no probe: saved before it) and the same workloads re-run at
# load 6-13 with the CPU probe and the load average recorded around every phase ("_loaded")
# ("_same_session": the three_stage run saved with pipeline.json at 10a5fce, same code and
# session, restored verbatim from git; pipeline_three_stage.json is a later session's)
RUNS = ("pipeline", "pipeline_three_stage", "pipeline_three_stage_s2",
        "pipeline_three_stage_same_session", "pipeline_loaded", "pipeline_three_stage_loaded")  # fmt: skip
# (source, target, same session): the first pair's runs are from two sessions hours apart
# with no record of either machine's speed, the others from one session each
# bench/heldout_interleaved.py --save: both workloads and schedules in one invocation, short
# phases interleaved round after round (sim/interleaved.py): where saved, what ``met`` reads
INTERLEAVED = "pipeline_interleaved"
CROSS = (("pipeline", "pipeline_three_stage", False), ("pipeline_three_stage", "pipeline", False),
         ("pipeline", "pipeline_three_stage_same_session", True),
         ("pipeline_three_stage_same_session", "pipeline", True),
         ("pipeline_loaded", "pipeline_three_stage_loaded", True),
         ("pipeline_three_stage_loaded", "pipeline_loaded", True))  # fmt: skip


def load_run(root: Path, name: str) -> dict:
    return json.loads((root / "bench" / "results" / f"{name}.json").read_text())


def _cfg(root: Path, saved: dict, schedule: str):
    sys.path.insert(0, str(root / "bench"))
    import pipeline as P  # bench/pipeline.py: the overrides the bench ran

    from spade_async import recipe

    w = saved["workload"]
    three, stale = w["name"] == "three_stage", w["max_staleness"]
    quick = bool(saved.get("quick"))  # the bench's --quick workload (fewer plays, tokens)
    over = P.overrides(root, root, quick, P.lookahead_steps(three, stale), stale, 0)
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


def predict_phases(root: Path, saved: dict, costs: list, schedule: str) -> dict:
    """One arm's wall predicted phase by phase: ``costs[i]`` for phase ``i`` (each simulated
    from an empty pipeline), the walls summed."""
    from spade_async.sim.runtime import simulate

    m = saved[schedule]
    if len(costs) != m["phases"]:
        raise ValueError(f"{len(costs)} costs for {m['phases']} phases")
    cfg = _cfg(root, saved, schedule)
    sims = [simulate(cfg, c, m["steps"] // m["phases"]) for c in costs]
    predicted = sum(x["wall_s"] for x in sims)
    return {"measured_wall_s": m["wall_s"], "predicted_wall_s": round(predicted, 2),
            "error": round(predicted / m["wall_s"] - 1, 3),
            "max_sample_age": max(x["max_sample_age"] for x in sims)}  # fmt: skip


def short(name: str) -> str:
    """A saved run's name as its workload: pipeline_three_stage_loaded -> three_stage_loaded."""
    return name.replace("pipeline_three_stage", "three_stage").replace("pipeline", "two_stage")


def _probed(d: dict) -> bool:
    return all(d[a].get("probe_points") for a in ("sync", "async"))


IN_SAMPLE = ("cross_workload+speed",)  # kinds that read a timing of the predicted work


def cross_costs(s: dict, t: dict, src: str) -> dict[str, dict[str, list]]:
    """``{kind: {arm: [Costs per phase]}}`` (one ``Costs`` for every phase, or one per
    phase) predicting ``t``'s arms from ``s``'s sync-arm per-unit costs: raw; ``+probe``
    (where both runs carry the CPU probe) scaled per phase by its probe; ``+speed`` by the
    target trainer's own seconds per token (in sample). Outside ``IN_SAMPLE`` nothing of
    ``t`` enters but its workload, its steps and phases, its trained tokens (the workload's
    known size) and its probe points."""
    base = cpu_costs(s, ("sync",))
    factor = engine_contention(s)  # the source's own: the target's async arm held out

    def arm_costs(arm: str, c):
        return c if arm == "sync" else with_factor(c, "engine", factor, f"{src} run")

    out: dict[str, dict[str, list]] = {}
    for kind, sp in (("cross_workload", 1.0), ("cross_workload+speed", run_speed(s, t))):
        out[kind] = {arm: [arm_costs(arm, transfer(base, s, t, sp))] for arm in ("sync", "async")}
    if _probed(s) and _probed(t):
        out["cross_workload+probe"] = {
            arm: [arm_costs(arm, transfer(base, s, t, probe_speed(s, t, arm, i)))
                  for i in range(t[arm]["phases"])]
            for arm in ("sync", "async")
        }  # fmt: skip
        # the load average's fair share per phase; under load the async arm's own overlap
        # slows both stages (ours compete with each other's share of the others): the
        # source's async-over-sync slowdown of each, its load taken out (``contention``)
        ce, ct = contention(s, "engine", by_load=True), contention(s, "trainer", by_load=True)

        def loaded(arm: str, c):
            if arm == "sync":
                return c
            c = with_factor(c, "engine", ce, f"{src} run, its load out")
            return with_factor(c, "trainer", ct, f"{src} run, its load out")

        out["cross_workload+load"] = {
            arm: [loaded(arm, transfer(base, s, t, load_speed(s, t, arm, i)))
                  for i in range(t[arm]["phases"])]
            for arm in ("sync", "async")
        }  # fmt: skip
    return out


def cross_rows(root: Path, s: dict, t: dict, src: str, dst: str) -> list[dict]:
    """The rows of ``cross_costs``, each arm's wall simulated and set against the measured."""
    label = f"{short(src)} -> {short(dst)}".replace("_same_session", "_same_sess")
    rows = []
    for kind, arms in cross_costs(s, t, src).items():
        for arm, costs in arms.items():
            sp = costs[0].notes.get("speed", {})
            if kind in ("cross_workload+probe", "cross_workload+load"):
                said = f", {kind.split('+')[1]} per phase: " + "; ".join(
                    ", ".join(f"{k} x{v:.3f}" for k, v in c.notes["speed"].items()) for c in costs
                )
                pred = predict_phases(root, t, costs, arm)
            else:
                said = (
                    f", target trainer x{sp['trainer']:.3f} (in sample)"
                    if kind in IN_SAMPLE
                    else ""
                )
                pred = predict_wall(root, t, costs[0], arm)
            rows.append({"kind": kind, "run": dst, "source": src, "arm": arm, "label": label,
                         "loaded": _probed(t),
                         "costs_from": f"{src} sync arm{said}",
                         **({"in_sample": True} if kind in IN_SAMPLE else {}), **pred})  # fmt: skip
    return rows


def async_costs(runs: dict[str, dict], name: str) -> dict:
    """The costs predicting run ``name``'s async wall: its sync arm's alone, and those with
    the engine's async-over-sync slowdown measured on the *other* runs (``factor``)."""
    sync_only = cpu_costs(runs[name], ("sync",))
    # the quiet runs' (no load recorded): a loaded run's raw slowdown is mostly its load's
    others = [engine_contention(runs[o]) for o in runs if o != name and not _probed(runs[o])]
    factor = sum(others) / len(others)
    held = with_factor(sync_only, "engine", factor, "async/sync engine slowdown, other runs")
    out = {"sync_to_async": [sync_only], "sync_to_async+contention": [held], "factor": factor}
    probed = [o for o in runs if o != name and _probed(runs[o])]
    if _probed(runs[name]) and probed:  # + the load per async phase, contention load-free
        d = runs[name]
        ce = sum(contention(runs[o], "engine", by_load=True) for o in probed) / len(probed)
        ct = sum(contention(runs[o], "trainer", by_load=True) for o in probed) / len(probed)
        why = f"async/sync slowdown, load out, {'+'.join(probed)}"
        out["sync_to_async+load"] = [
            with_factor(with_factor(
                transfer(sync_only, d, d, load_speed(d, d, "async", i)), "engine", ce, why),
                "trainer", ct, why)
            for i in range(d["async"]["phases"])
        ]  # fmt: skip
    return out


def heldout_table(root: Path) -> list[dict]:
    runs = {n: load_run(root, n) for n in RUNS}
    rows = []
    for name, d in runs.items():
        w = d["workload"]
        cpu = d["hardware"].get("cpu", "?").replace("(R)", "")[:10]
        label = f"{short(name).replace('_same_session', '_same_sess')} s{w['max_staleness']} {cpu}"
        if _probed(d):  # the load average around its sync / async phases
            label += f" L{load_of(d, 'sync'):.1f}/{load_of(d, 'async'):.1f}"
        held = async_costs(runs, name)
        factor = held.pop("factor")
        for kind, costs in held.items():
            pred = (predict_wall(root, d, costs[0], "async") if len(costs) == 1
                    else predict_phases(root, d, costs, "async"))  # fmt: skip
            notes = costs[0].notes
            extra = ({"engine_factor": round(factor, 3),
                      "engine_factor_in_sample": round(engine_contention(d), 3)}
                     if kind == "sync_to_async+contention" else
                     {"engine_factor": round(notes["engine_factor"], 3),
                      "trainer_factor": round(notes["trainer_factor"], 3)}
                     if kind == "sync_to_async+load" else {})  # fmt: skip
            rows.append({"kind": kind, "run": name, "label": label, "arm": "async", "loaded": _probed(d),
                         "costs_from": f"{name} sync arm", **pred, **extra})  # fmt: skip
    for src, dst, same in CROSS:
        rows += [
            {**r, "same_session": same} for r in cross_rows(root, runs[src], runs[dst], src, dst)
        ]
    if (root / "bench" / "results" / f"{INTERLEAVED}.json").is_file():
        from spade_async.sim.interleaved import interleaved_rows  # it builds on this module

        rows += interleaved_rows(root, load_run(root, INTERLEAVED))
    return rows


def format_heldout(rows: list[dict]) -> str:
    """The out-of-sample rows as a table (the in-sample ``+speed`` rows stay in the JSON)."""
    head = (
        f"{'prediction':<24} {'run':<40} {'arm':<5} {'measured':>8} {'predicted':>9} {'error':>6}"
    )
    out = [head, "-" * len(head)]
    for r in rows:
        if r.get("in_sample"):
            continue
        out.append(f"{r['kind']:<24} {r['label'][:40]:<40} {r['arm']:<5} "
                   f"{r['measured_wall_s']:>8.1f} {r['predicted_wall_s']:>9.1f} "
                   f"{r['error']:>+6.1%}")  # fmt: skip
    return "\n".join(out)


def worst(rows: list[dict], kind: str) -> float | None:
    """The largest |error| among ``kind``'s rows (None: no such row)."""
    errors = [abs(r["error"]) for r in rows if r["kind"] == kind]
    return max(errors) if errors else None


def heldout_targets(rows: list[dict]) -> dict:
    """The issue's two validation targets, each measured from ``rows`` and met from that.

    Async from sync: each run's out-of-sample row (a quiet run: ``+contention``; a loaded
    run: ``+load``, its load per phase and the contention of the other loaded runs).
    Cross-workload: every same-session pair's out-of-sample row (quiet: raw, nothing else
    recorded; loaded: ``+load``); the two-session quiet pair and the in-sample ``+speed``
    rows are measured and shown, never what ``met`` reads.

    Where the interleaved bench is saved (rows with ``interleaved``: ``INTERLEAVED``), ``met``
    reads its whole-run rows instead (``round`` "all": ``sync_to_async+contention``; of
    ``cross_workload``, both arms, both workloads), the analogue of a separate run's
    prediction with the machine's drift, which no probe or load model tracked, spread over
    every arm alike; each round's errors (mean, max) are shown beside it, as are the
    separate runs' figures (``separate_runs`` and the rest)."""

    inter = [r for r in rows if r.get("interleaved") and r["round"] != "all"]
    pooled = [r for r in rows if r.get("interleaved") and r["round"] == "all"]
    rows = [r for r in rows if not r.get("interleaved")]

    def of(kind: str, loaded: bool | None = None, same: bool | None = None) -> float | None:
        return worst([r for r in rows if (loaded is None or r.get("loaded") == loaded)
                      and (same is None or r.get("same_session") == same)], kind)  # fmt: skip

    def mean(kind: str) -> float | None:
        errs = [abs(r["error"]) for r in inter if r["kind"] == kind]
        return round(sum(errs) / len(errs), 3) if errs else None

    def most(*xs: float | None) -> float | None:
        got = [x for x in xs if x is not None]
        return max(got) if got else None

    a2a_runs = most(of("sync_to_async+contention", False), of("sync_to_async+load", True))
    xw_runs = most(of("cross_workload", False, True), of("cross_workload+load", True, True))
    # the interleaved bench, where saved, is what met reads: drift hits every arm alike there
    a2a = worst(pooled, "sync_to_async+contention") if pooled else a2a_runs
    xw = worst(pooled, "cross_workload") if pooled else xw_runs
    source = ("bench/results/pipeline_interleaved.json, the whole run (every round pooled)"
              if pooled else "the separate saved runs")  # fmt: skip
    return {
        "sync_to_async_within_5pct": {
            "target": "|error| <= 5%: each async wall from sync-only costs and the "
            "async-over-sync engine contention measured elsewhere; interleaved bench (where "
            "saved): every round's async phase from its workload's sync phases of the adjacent "
            "rounds; else each saved bench/pipeline.py run from its sync arm (a loaded run: "
            "its load average per phase too)",
            "measured": {
                "out_of_sample": a2a,
                "out_of_sample_from": source,
                "interleaved_pooled_sync_costs_only": worst(pooled, "sync_to_async"),
                "interleaved_round_max": worst(inter, "sync_to_async+contention"),
                "interleaved_round_mean": mean("sync_to_async+contention"),
                "interleaved_round_sync_costs_only_max": worst(inter, "sync_to_async"),
                "separate_runs": a2a_runs,
                "with_contention": of("sync_to_async+contention", False),
                "loaded_with_load": of("sync_to_async+load", True),
                "loaded_with_contention": of("sync_to_async+contention", True),
                "sync_costs_only": of("sync_to_async"),
            },  # fmt: skip
            "met": a2a is not None and a2a <= 0.05,
        },
        "cross_workload_within_10pct": {
            "target": "|error| <= 10%: one workload's sync-arm per-unit costs, carried with the "
            "other's known differences (and, where recorded, the load average around each of "
            "its phases, never a timing of its work), predict the other's sync and async "
            "walls; interleaved bench (where saved): every round's phases of each workload "
            "from the other's sync phases of the adjacent rounds; else every pair of runs "
            "from one session",
            "measured": {
                "out_of_sample": xw,
                "out_of_sample_from": source,
                "interleaved_round_max": worst(inter, "cross_workload"),
                "interleaved_round_mean": mean("cross_workload"),
                "separate_runs": xw_runs,
                "raw": of("cross_workload"),
                "raw_same_session": of("cross_workload", None, True),
                "raw_two_sessions": of("cross_workload", None, False),
                "loaded_with_load": of("cross_workload+load", True),
                "loaded_with_probe": of("cross_workload+probe", True),
                # the target's own trainer speed: in sample, not a prediction, never 'met'
                "with_run_speed": of("cross_workload+speed"),
            },
            "met": xw is not None and xw <= 0.10,
        },
    }
