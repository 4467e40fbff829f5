"""``spade env check`` wall time on a valid environment: median of N runs of the CLI.

    python bench/env_check.py [--runs 7] [--file spade_async/envs/examples/mastermind.py]
    python bench/env_check.py --in-pool   # validate_source in a long-lived pre-warmed pool

Each run is a fresh ``python -m spade_async.cli env check FILE --json`` process (what a
user waits for). Prints one JSON line: per-run seconds, the median, and the verdict's own
``seconds`` (gates only, without interpreter start). ``--in-pool`` instead times
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--file", default=str(ROOT / "spade_async/envs/examples/mastermind.py"))
    ap.add_argument("--in-pool", action="store_true", help="time validate_source in a warm pool")
    args = ap.parse_args()
    if args.in_pool:
        import anyio

        secs = anyio.run(in_pool, Path(args.file).read_text(), args.runs)
        print(json.dumps({
            "file": Path(args.file).name, "runs": args.runs, "mode": "in_pool",
            "check_s": [round(s, 4) for s in secs], "median_check_s": round(statistics.median(secs), 4),
        }))  # fmt: skip
        return
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
