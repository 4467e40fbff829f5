"""The interleaved held-out bench stays out of sample (``spade_async/sim/interleaved.py``):
the costs (and the simulated walls) predicting a phase never change when that phase's own
timings are poisoned x1000, they do when a phase they are built from is; the held-out
targets are met from the interleaved rows where saved; ``bench/heldout_interleaved.py
--quick`` prints one JSON object with its targets (slow: it runs both workloads)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spade_async.sim.heldout import INTERLEAVED, heldout_targets, load_run
from spade_async.sim.interleaved import interleaved_costs, predict_wall

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def saved() -> dict:
    return load_run(ROOT, INTERLEAVED)


def poisoned(d: dict, workload: str, schedule: str, rnd: int) -> dict:
    """``d`` with one phase's every timing x1000: stage busy times, wall, controller CPU."""
    d = copy.deepcopy(d)
    (p,) = [p for p in d["phases"] if (p["workload"], p["schedule"], p["round"])
            == (workload, schedule, rnd)]  # fmt: skip
    p["busy_s"] = {k: v * 1000 for k, v in p["busy_s"].items()}
    p["wall_s"] *= 1000
    p["controller_cpu_s"] *= 1000
    return d


def _key(meta: dict) -> tuple:
    return meta["kind"], meta["workload"], meta["round"], meta["arm"]


def test_a_phase_never_enters_its_own_prediction(saved):
    clean = {_key(m): c for m, c, _ in interleaved_costs(saved)}
    kinds = {k[0] for k in clean}
    assert kinds == {"sync_to_async", "sync_to_async+contention", "cross_workload"}
    for meta, _, _ in interleaved_costs(saved):
        every = range(saved["rounds"]) if meta["round"] == "all" else [meta["round"]]
        bad = saved
        for r in every:  # the whole run's prediction: every round's phase of that arm
            bad = poisoned(bad, meta["workload"], meta["arm"], r)
        got = {_key(m): c for m, c, _ in interleaved_costs(bad)}
        assert got[_key(meta)] == clean[_key(meta)], meta


def test_the_phases_it_is_built_from_do_enter(saved):
    """The check above can fail: poisoning a sync phase of the adjacent rounds moves the
    sync-to-async costs of its workload and the cross-workload costs of the other."""
    w, other = list(saved["workloads"])
    bad = {_key(m): c for m, c, _ in interleaved_costs(poisoned(saved, w, "sync", 0))}
    for meta, c, _ in interleaved_costs(saved):
        if meta["round"] not in (0, 1):
            continue
        if meta["kind"].startswith("sync_to_async") and meta["workload"] == w:
            assert bad[_key(meta)] != c, meta
        if meta["kind"] == "cross_workload" and meta["workload"] == other:
            assert bad[_key(meta)] != c, meta


def test_the_simulated_wall_ignores_the_predicted_phase(saved):
    """One round's walls simulated from clean and poisoned runs: the same prediction."""
    for meta, costs, run in interleaved_costs(saved):
        if meta["round"] != 0 or meta["kind"] == "sync_to_async":
            continue
        bad = poisoned(saved, meta["workload"], meta["arm"], 0)
        (b,) = [(c, r) for m, c, r in interleaved_costs(bad) if _key(m) == _key(meta)]
        clean = predict_wall(ROOT, run, costs, meta["arm"])
        dirty = predict_wall(ROOT, b[1], b[0], meta["arm"])
        assert dirty["predicted_wall_s"] == clean["predicted_wall_s"], meta
        assert dirty["measured_wall_s"] == pytest.approx(1000 * clean["measured_wall_s"], abs=5.1)


def test_the_targets_read_the_interleaved_rows_where_saved():
    old = [{"kind": "sync_to_async+contention", "error": 0.02, "loaded": False},
           {"kind": "cross_workload", "error": 0.30, "same_session": True, "loaded": False}]  # fmt: skip
    t = heldout_targets(old)
    assert t["cross_workload_within_10pct"]["met"] is False
    one = {"interleaved": True, "round": 0}
    inter = [{"kind": "sync_to_async+contention", "error": -0.06, **one},
             {"kind": "sync_to_async+contention", "error": 0.01, **one, "round": 1},
             {"kind": "cross_workload", "error": 0.15, **one},
             # the whole run (round "all"): what met reads
             {"kind": "sync_to_async+contention", "error": 0.051, **one, "round": "all"},
             {"kind": "cross_workload", "error": -0.07, **one, "round": "all"}]  # fmt: skip
    t = heldout_targets(old + inter)
    a2a, xw = t["sync_to_async_within_5pct"], t["cross_workload_within_10pct"]
    assert a2a["measured"]["out_of_sample"] == 0.051 and a2a["met"] is False
    assert a2a["measured"]["interleaved_round_mean"] == 0.035
    assert a2a["measured"]["interleaved_round_max"] == 0.06
    assert a2a["measured"]["separate_runs"] == 0.02
    assert xw["measured"]["out_of_sample"] == 0.07 and xw["met"] is True
    assert xw["measured"]["interleaved_round_max"] == 0.15
    assert xw["measured"]["separate_runs"] == 0.30
    inter[3]["error"] = -0.05
    assert heldout_targets(old + inter)["sync_to_async_within_5pct"]["met"] is True


def test_the_saved_run_targets_are_met_from_their_own_measured_values(saved):
    assert saved["targets"] == heldout_targets(saved["heldout"])
    for name, limit in (("sync_to_async_within_5pct", 0.05), ("cross_workload_within_10pct", 0.10)):
        t = saved["targets"][name]
        assert t["met"] == (t["measured"]["out_of_sample"] <= limit)
    errors = [abs(r["error"]) for r in saved["heldout"]
              if r["kind"] == "cross_workload" and r["round"] != "all"]  # fmt: skip
    assert saved["summary"]["cross_workload"]["max_abs"] == round(max(errors), 3)


@pytest.mark.slow
def test_quick_prints_one_json_object_with_targets():
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "heldout_interleaved.py"),
                          "--quick"], capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, lines[:-1]
    got = json.loads(lines[0])
    assert len(got["phases"]) == 4 * got["rounds"]
    for name, limit in (("sync_to_async_within_5pct", 0.05), ("cross_workload_within_10pct", 0.10)):
        t = got["targets"][name]
        assert t["met"] == (t["measured"]["out_of_sample"] <= limit)
    assert {r["kind"] for r in got["heldout"]} == set(got["summary"])


def test_env_diagnosis_reads_each_workloads_own_env_span(saved):
    """``env_diagnosis``: the carried overhead is the source's env busy span a turn less its
    sleep, the own one the target's; putting the target's own in makes the carried row's
    costs the target's own environment, so two workloads of equal overhead would agree."""
    from spade_async.sim.interleaved import env_diagnosis

    def span(w: str) -> float:
        ph = [p for p in saved["phases"] if p["workload"] == w and p["schedule"] == "sync"]
        meta = saved["workloads"][w]
        per_turn = sum(p["busy_s"]["env_pool"] for p in ph) / sum(p["steps"] for p in ph)
        return max(0.0, per_turn / meta["turns"] - meta["env_step_sleep_s"])

    rows = {r["workload"]: r for r in env_diagnosis(ROOT, saved)}
    assert set(rows) == set(saved["workloads"])
    for w, r in rows.items():
        (o,) = [n for n in saved["workloads"] if n != w]
        assert r["source"] == o
        assert r["env_overhead_own_s"] == pytest.approx(span(w), abs=1e-4)
        assert r["env_overhead_carried_s"] == pytest.approx(span(o), abs=1e-4)
    # one workload's env span set to the other's: the carried overhead equals the own, and so
    # do the two errors (the diagnosis changes nothing where there is nothing to explain)
    same = copy.deepcopy(saved)
    a, b = list(saved["workloads"])
    for p in same["phases"]:
        if p["workload"] == a and p["schedule"] == "sync":
            sleep_a, turns = same["workloads"][a]["env_step_sleep_s"], same["workloads"][a]["turns"]
            p["busy_s"]["env_pool"] = (span(b) + sleep_a) * turns * p["steps"]
    r = {x["workload"]: x for x in env_diagnosis(ROOT, same)}[b]
    assert r["env_overhead_carried_s"] == pytest.approx(r["env_overhead_own_s"], abs=1e-4)
    assert r["error_carried"] == r["error_with_own_env_overhead"]
