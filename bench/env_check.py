"""``spade env check`` wall time on a valid environment: median of N runs of the CLI.

    python bench/env_check.py [--quick] [--save] [--runs 7] [--file ENV.py]

Each run is a fresh ``python -m spade_async.cli env check FILE --json`` process (what a
user waits for). Prints one JSON line: per-run seconds, the median, and the verdict's own
``seconds`` (gates only, without interpreter start). It also times
``validate_source`` in one pool with ``prewarm=2`` (as the designer's checks run in
training), waiting before each check until the pre-warmed reserve is back.
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


async def in_pool(source: str, runs: int) -> list[float]:
    import anyio

    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.envs.validate import validate_source

    secs = []
    async with EnvPool(PoolConfig(prewarm=2, max_workers=8)) as pool:
        for _ in range(runs):
            while pool.stats()["idle"] < 2:
                await anyio.sleep(0.01)
            t0 = time.perf_counter()
            verdict = await validate_source(source, pool=pool)
            secs.append(time.perf_counter() - t0)
            assert verdict.valid, verdict
    return secs


# ``spade env check`` before the cross-process gates (19ad308), on this project's 2-core machine
# at light load, measured alternately with the new code by the session that added them
# (bench/results/env_check.json keeps this run's figures beside them).
BEFORE = {"cli_wall_s": 0.267, "in_pool_s": 0.098}


def _cli(file: str, runs: int) -> tuple[list[float], list[float], str]:
    walls, gates, isolation = [], [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "spade_async.cli", "env", "check", file, "--json"],
            capture_output=True, text=True, check=False, cwd=ROOT,
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
        verdict = json.loads(out.stdout.strip().splitlines()[-1])
        if not verdict["valid"]:
            raise SystemExit(f"error: {file} is not valid here: {verdict.get('reason')}")
        gates.append(verdict["seconds"])
        isolation = verdict["isolation"]
    return walls, gates, isolation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 runs of each")
    ap.add_argument("--save", action="store_true", help="write bench/results/env_check.json")
    ap.add_argument("--file", default=str(ROOT / "spade_async/envs/examples/mastermind.py"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import anyio
    from _hw import emit, machine

    runs = 3 if args.quick else args.runs
    walls, gates, isolation = _cli(args.file, runs)
    pooled = anyio.run(in_pool, Path(args.file).read_text(), runs)
    cli_s, pool_s = statistics.median(walls), statistics.median(pooled)
    limit = 1.5
    out = {
        "hardware": {**machine(), "isolation": isolation},
        "workload": {"file": Path(args.file).name, "runs": runs, "quick": args.quick},
        "targets": {
            "cli_median_vs_before": {
                "target": f"<= {limit}x {BEFORE['cli_wall_s']} s (spade env check, 19ad308)",
                "measured": round(cli_s, 3),
                "met": cli_s <= limit * BEFORE["cli_wall_s"],
            },
            "in_pool_median_vs_before": {
                "target": f"<= {limit}x {BEFORE['in_pool_s']} s (pre-warmed pool, 19ad308)",
                "measured": round(pool_s, 4),
                "met": pool_s <= limit * BEFORE["in_pool_s"],
            },
        },
        "supplementary": {
            "cli_wall_s": [round(w, 3) for w in walls],
            "median_gates_s": round(statistics.median(gates), 3),
            "in_pool_s": [round(s, 4) for s in pooled],
        },
    }
    emit(out, "env_check", args.save)


if __name__ == "__main__":
    main()
