"""The simulator's held-out validation alone (``spade_async/sim/heldout.py``), and the drift
that makes it hard: every saved ``bench/pipeline.py`` run's walls predicted from costs not
measured on what is predicted, and each run's per-phase stage costs beside the CPU probe
and the load average measured around that phase; where ``bench/heldout_interleaved.py
--save`` has run, its rounds too (``interleaved``), and the targets' ``met`` reads those.

    python bench/heldout.py [--quick] [--save]

No workload runs: it reads ``bench/results/pipeline*.json`` (``RUNS``, ``INTERLEAVED``) and simulates
(``--quick`` is accepted and changes nothing). ``--save`` writes
``bench/results/pipeline_heldout.json``. The last line printed is one JSON object: hardware,
the command, the table, the drift, and each target with measured and met.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _hw import emit, machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _spread(values: list[float]) -> float:
    """max / min - 1 (0.0 for one value)."""
    return round(max(values) / min(values) - 1, 3) if values and min(values) > 0 else 0.0


def drift(saved: dict) -> dict | None:
    """Per phase of a probed run: the engine's seconds per step and the trainer's per step
    (the same work in every phase of an arm), the probe's core 0 and core 1 seconds, the
    load average after the phase; the spread of the raw costs against that of the costs
    over the probe (how much of the drift the probe explains). None: no probe saved."""
    out: dict = {"phases": []}
    for arm in ("sync", "async"):
        m = saved[arm]
        if not m.get("probe_points"):
            return None
        steps = m["steps"] // m["phases"]
        for i, busy in enumerate(m["busy_s_per_phase"]):
            pts = m["probe_points"][2 * i : 2 * i + 2]
            c0 = statistics.fmean(p["core0"]["torch_s"] for p in pts)
            c1 = statistics.fmean(p["core1"]["torch_s"] for p in pts)
            out["phases"].append(
                {"arm": arm, "phase": i, "engine_s_per_step": round(busy["engine"] / steps, 3),
                 "trainer_s_per_step": round(busy["trainer"] / steps, 3),
                 "probe_core0_s": round(c0, 5), "probe_core1_s": round(c1, 5),
                 "engine_over_probe": round(busy["engine"] / steps / c0, 1),
                 "trainer_over_probe": round(busy["trainer"] / steps / c1, 1),
                 "load_avg_1m": [p["load_avg_1m"] for p in pts],
                 "wall_s": m["wall_s_per_phase"][i]})  # fmt: skip
    for arm in ("sync", "async"):
        rows = [r for r in out["phases"] if r["arm"] == arm]
        out[arm] = {
            f"{k}_spread": _spread([r[k] for r in rows])
            for k in (
                "engine_s_per_step",
                "engine_over_probe",
                "trainer_s_per_step",
                "trainer_over_probe",
            )  # fmt: skip
        }
    return out


def interleaved(rows: list[dict]) -> dict | None:
    """The interleaved bench's saved run, its rows' errors per round (mean, max) and the
    load around them; None where it is not saved."""
    from spade_async.sim.heldout import INTERLEAVED, load_run
    from spade_async.sim.interleaved import interleaved_summary

    mine = [r for r in rows if r.get("interleaved")]
    if not mine:
        return None
    saved = load_run(ROOT, INTERLEAVED)
    return {"file": f"bench/results/{INTERLEAVED}.json", "command": saved["command"],
            "rounds": saved["rounds"], "phase_steps": saved["phase_steps"],
            "load_avg_1m_range": saved["load_avg_1m_range"],
            "summary": interleaved_summary(mine)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="accepted; the table is quick already")
    ap.add_argument("--save", action="store_true", help="write bench/results/pipeline_heldout.json")
    args = ap.parse_args()
    from spade_async.sim.heldout import (
        RUNS,
        format_heldout,
        heldout_table,
        heldout_targets,
        load_run,
    )

    t0 = time.perf_counter()
    rows = heldout_table(ROOT)
    print(format_heldout(rows), file=sys.stderr, flush=True)
    runs = {n: load_run(ROOT, n) for n in RUNS}
    out = {
        "bench": "heldout",
        "command": "python bench/heldout.py" + (" --quick" if args.quick else "")
        + (" --save" if args.save else ""),
        "hardware": machine(),
        "total_s": round(time.perf_counter() - t0, 1),
        # the same trainer work in every run (88,448 tokens an arm on its own core): its
        # speed from run to run is the machine's
        "runs": {n: {"cpu": d["hardware"].get("cpu"), "load_avg_1m_at_start":
                     d["hardware"].get("load_avg_1m"), "total_s": d.get("total_s"),
                     "trainer_ms_per_token_sync": round(1000 * d["sync"]["busy_s"]["trainer"]
                                                        / d["sync"]["trained_tokens"], 3),
                     "engine_s_per_step_sync": round(d["sync"]["busy_s"]["engine"]
                                                     / d["sync"]["steps"], 3),
                     "controller_cpu_s_per_step_sync": round(d["sync"]["controller_cpu_s"]
                                                             / d["sync"]["steps"], 3),
                     "probe": d["hardware"].get("probe")} for n, d in runs.items()},
        # the separate runs (the interleaved bench's rows: its own JSON's table)
        "table": format_heldout([r for r in rows if not r.get("interleaved")]),
        "heldout": rows,
        "drift": {n: drift(d) for n, d in runs.items()},
        # bench/heldout_interleaved.py --save, where saved: what the targets' met reads
        "interleaved": interleaved(rows),
        "targets": heldout_targets(rows),
    }  # fmt: skip
    emit(out, "pipeline_heldout", args.save)


if __name__ == "__main__":
    main()
