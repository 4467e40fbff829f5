"""``spade report`` and ``spade episode replay --all`` on the recorded 3-step demo run.

    python bench/report.py [--quick] [--save]

The run directory is tests/fixtures/demo_run (configs/cpu-demo.toml with the tiny model,
async, 3 steps). Each command runs as a fresh process, as a user runs it (imports
included). Targets: the report in under 10 s on 2 cores; 100% of the run's episodes
replay exactly. The last line printed is one JSON object; ``--save`` writes
bench/results/report.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _hw import emit, machine

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "demo_run"


def _spade(*args: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the child: user + system, its own children included, proc)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "spade_async.cli", *args], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one repetition (under a minute)")
    ap.add_argument("--save", action="store_true", help="write bench/results/report.json")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="spade-bench-report-") as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(FIXTURE, run)
        times, cpus = [], []
        for _ in range(reps):
            seconds, cpu, proc = _spade("report", str(run), "--out", str(Path(tmp) / "out"))
            if proc.returncode != 0:
                raise SystemExit(f"spade report failed: {proc.stderr[-2000:]}")
            times.append(seconds)
            cpus.append(cpu)
        page_kib = (Path(tmp) / "out" / "index.html").stat().st_size / 1024
        replay_s, _, proc = _spade("episode", "replay", str(run), "--all", "--json")
        summary = json.loads(proc.stdout.splitlines()[-1])
    report_s = statistics.median(times)
    out = {
        "name": "report",
        "quick": args.quick,
        "hardware": machine(),
        "run_dir": "tests/fixtures/demo_run (3 steps, configs/cpu-demo.toml, tiny model)",
        "report_s": [round(t, 3) for t in times],
        "report_cpu_s": [round(t, 3) for t in cpus],  # the work itself, whatever the load
        "note": "wall time depends on the load of the shared machine (hardware.load_avg_1m)",
        "page_kib": round(page_kib, 1),
        "replay": {
            "seconds": round(replay_s, 2),
            "checked": summary["checked"],
            "exact": summary["exact"],
        },  # fmt: skip
        "targets": {
            "report_seconds": {
                "target": "< 10 s (2 cores)",
                "measured": round(report_s, 3),
                "met": report_s < 10.0,
            },  # fmt: skip
            "episodes_replayed_exactly": {
                "target": "100%",
                "measured": summary["share"],
                "met": summary["share"] == 1.0,
            },  # fmt: skip
        },
    }
    emit(out, "report", args.save)


if __name__ == "__main__":
    main()
