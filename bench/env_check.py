"""``spade env check`` wall time on a valid environment: median of N runs of the CLI.

    python bench/env_check.py [--runs 7] [--file spade_async/envs/examples/mastermind.py]

Each run is a fresh ``python -m spade_async.cli env check FILE --json`` process (what a
user waits for). Prints one JSON line: per-run seconds, the median, and the verdict's own
``seconds`` (gates only, without interpreter start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--file", default=str(ROOT / "spade_async/envs/examples/mastermind.py"))
    args = ap.parse_args()
    walls, gates = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "spade_async.cli", "env", "check", args.file, "--json"],
            capture_output=True, text=True, check=False, cwd=ROOT,
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
        verdict = json.loads(out.stdout.strip().splitlines()[-1])
        assert verdict["valid"], verdict
        gates.append(verdict["seconds"])
    print(json.dumps({
        "file": Path(args.file).name, "runs": args.runs,
        "wall_s": [round(w, 3) for w in walls], "median_wall_s": round(statistics.median(walls), 3),
        "median_gates_s": round(statistics.median(gates), 3), "isolation": verdict["isolation"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
