"""The held-out validation stays out of sample (``spade_async/sim/heldout.py``): computed
from the saved ``bench/results/pipeline*.json`` runs, the costs that predict a run never
change when that run's own timings do (every timing of its work poisoned x1000), and the
targets are met from out-of-sample rows only. No simulation here: the costs are compared
(the slow recomputation of the saved table is ``test_the_saved_table_is_the_recomputed_one``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from spade_async.sim.calibrate import PROBE_PARTS, load_speed, probe_of, probe_speed, slowdown
from spade_async.sim.heldout import (
    CROSS,
    IN_SAMPLE,
    RUNS,
    async_costs,
    cross_costs,
    heldout_targets,
    load_run,
)

ROOT = Path(__file__).resolve().parents[2]


def poisoned(d: dict, arms: tuple[str, ...] = ("sync", "async")) -> dict:
    """``d`` with every timing of its work in ``arms`` multiplied by 1000: stage busy times
    (whole and per phase), walls per phase, controller CPU. The measured walls (``wall_s``)
    stay: they are what a prediction is compared with, never an input."""
    d = copy.deepcopy(d)
    for arm in arms:
        m = d[arm]
        m["busy_s"] = {k: v * 1000 for k, v in m["busy_s"].items()}
        m["busy_s_per_phase"] = [{k: v * 1000 for k, v in p.items()} for p in m.get("busy_s_per_phase", [])]  # fmt: skip
        m["wall_s_per_phase"] = [w * 1000 for w in m["wall_s_per_phase"]]
        m["controller_cpu_s"] *= 1000
    return d


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {n: load_run(ROOT, n) for n in RUNS}


@pytest.mark.parametrize("name", RUNS)
def test_the_async_prediction_never_reads_the_async_arm(runs, name):
    clean = async_costs(runs, name)
    dirty = async_costs({**runs, name: poisoned(runs[name], ("async",))}, name)
    assert clean == dirty
    # and the poison reaches what reads it: the sync arm is the costs' source
    assert async_costs({**runs, name: poisoned(runs[name], ("sync",))}, name) != clean


@pytest.mark.parametrize(("src", "dst", "same_session"), CROSS)
def test_a_cross_workload_prediction_never_reads_the_target_runs_work(runs, src, dst, same_session):
    s, t = runs[src], runs[dst]
    clean, dirty = cross_costs(s, t, src), cross_costs(s, poisoned(t), src)
    probed = all(d[a].get("probe_points") for d in (s, t) for a in ("sync", "async"))
    assert probed == dst.endswith("_loaded"), "the loaded runs carry the probe and the load"
    assert probed == ("cross_workload+load" in clean) == ("cross_workload+probe" in clean)
    for kind in clean:
        if kind in IN_SAMPLE:  # reads the target's trainer: the poison shows, as it must
            assert clean[kind] != dirty[kind]
        else:
            assert clean[kind] == dirty[kind], kind
    if not probed:
        return
    # the probe and the load do enter: another machine speed, other costs
    slower = copy.deepcopy(t)
    for p in slower["sync"]["probe_points"]:
        p["core1"]["torch_s"] *= 2
        p["load_avg_1m"] *= 2
    again = cross_costs(s, slower, src)
    for kind in ("cross_workload+probe", "cross_workload+load"):
        assert again[kind]["sync"] != clean[kind]["sync"]
        assert again[kind]["async"] == clean[kind]["async"]  # the async arm's own points


def test_the_probe_speed_is_each_cores_probe_in_that_phase_over_the_sources(runs):
    s, t = runs["pipeline_loaded"], runs["pipeline_three_stage_loaded"]
    src = s["sync"]["probe_points"]
    for arm in ("sync", "async"):
        for i in range(t[arm]["phases"]):
            pts = t[arm]["probe_points"][2 * i : 2 * i + 2]  # before and after phase i
            got = probe_speed(s, t, arm, i)
            for stage, (core, part) in PROBE_PARTS.items():
                mine = sum(p[core][part] for p in pts) / 2
                want = mine / (sum(p[core][part] for p in src) / len(src))
                assert got[stage] == pytest.approx(want), (arm, i, stage)


def test_the_load_speed_is_the_fair_share_slowdowns_ratio(runs):
    s, t = runs["pipeline_loaded"], runs["pipeline_three_stage_loaded"]
    assert slowdown(0.5) == 1.0 and slowdown(3.0) == 2.0  # 2 cores: alone, then (L + 1) / 2
    for i in range(t["async"]["phases"]):
        pts = t["async"]["probe_points"][2 * i : 2 * i + 2]
        mine = max(1.0, (sum(p["load_avg_1m"] for p in pts) / 2 + 1) / 2)
        src = s["sync"]["probe_points"]
        theirs = max(1.0, (sum(p["load_avg_1m"] for p in src) / len(src) + 1) / 2)
        got = load_speed(s, t, "async", i)
        assert all(v == pytest.approx(mine / theirs) for v in got.values()), got


def test_a_run_without_a_probe_is_named_with_its_fix(runs):
    bare = copy.deepcopy(runs["pipeline_loaded"])
    bare["sync"]["probe_points"] = []
    with pytest.raises(ValueError, match="no CPU probe.*bench/pipeline.py --save"):
        probe_of(bare, "sync")


def test_the_targets_are_met_from_the_out_of_sample_rows_only():
    q, ld = {"loaded": False}, {"loaded": True}
    rows = [
        {"kind": "sync_to_async", "error": 0.11, **q},
        {"kind": "sync_to_async+contention", "error": -0.03, **q},
        {"kind": "sync_to_async+contention", "error": -0.27, **ld},  # not a loaded run's row
        {"kind": "sync_to_async+load", "error": 0.04, **ld},
        {"kind": "cross_workload", "error": 0.30, "same_session": False, **q},  # two sessions
        {"kind": "cross_workload", "error": 0.08, "same_session": True, **q},
        {"kind": "cross_workload", "error": 0.25, "same_session": True, **ld},  # raw, loaded
        {"kind": "cross_workload+speed", "error": 0.01, "same_session": True, "in_sample": True},
        {"kind": "cross_workload+probe", "error": 0.01, "same_session": True, **ld},
        {"kind": "cross_workload+load", "error": -0.12, "same_session": True, **ld},
    ]
    t = heldout_targets(rows)
    assert t["sync_to_async_within_5pct"]["met"] is True
    assert t["sync_to_async_within_5pct"]["measured"]["out_of_sample"] == 0.04
    assert t["cross_workload_within_10pct"]["met"] is False
    assert t["cross_workload_within_10pct"]["measured"]["out_of_sample"] == 0.12
    rows[-1]["error"] = 0.09
    assert heldout_targets(rows)["cross_workload_within_10pct"]["met"] is True
    rows[5]["error"] = -0.101  # the quiet same-session pair counts too
    assert heldout_targets(rows)["cross_workload_within_10pct"]["met"] is False
    rows[3]["error"] = 0.051
    assert heldout_targets(rows)["sync_to_async_within_5pct"]["met"] is False


def test_the_saved_targets_are_met_from_their_own_measured_values():
    saved = json.loads((ROOT / "bench" / "results" / "pipeline_heldout.json").read_text())
    assert saved["targets"] == heldout_targets(saved["heldout"])
    for kind in ("cross_workload+probe", "cross_workload+load"):  # both arms of the loaded pairs
        got = [r for r in saved["heldout"] if r["kind"] == kind]
        assert len(got) == 2 * sum(dst.endswith("_loaded") for _, dst, _ in CROSS), kind


@pytest.mark.slow
def test_the_saved_table_is_the_recomputed_one():
    """bench/results/pipeline_heldout.json is what the saved runs give today."""
    from spade_async.sim.heldout import heldout_table

    saved = json.loads((ROOT / "bench" / "results" / "pipeline_heldout.json").read_text())
    assert heldout_table(ROOT) == saved["heldout"]
