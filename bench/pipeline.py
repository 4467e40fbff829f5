"""Sync vs async schedule on the same workload, in one run: wall time, per-stage busy time,
speedup, and the ideal bound (the busiest stage's time).

The CPU engine is pinned to core 0 and the trainer to core 1 (one torch thread each), so the
two stages really can overlap on this 2-core machine. The workload is a fixed pool of small
environments played by a random-initialised Llama sized so that generation and training
take comparable time; the same steps, environments, plays and tokens run under both
schedules.

    python bench/pipeline.py [--quick] [--save]

Targets (issue 7): async >= 1.6x faster than sync; async within 1.25x of the ideal bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = '''"""Bench environment {i}: a dense reward, the share of lower-case letters in the replies."""


class Letters{i}Env:
    def __init__(self, max_turns: int = 2, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn, self.score = 0, 0.0
        return "Environment {i}: answer twice in lower-case letters only.", {{}}

    def step(self, action):
        self.turn += 1
        text = (action or "").strip()
        share = sum(c.islower() for c in text) / len(text) if text else 0.0
        self.score += share / self.max_turns
        if self.turn >= self.max_turns:
            return "done", round(self.score, 4) if self.score < 1 else 1.0, True, False, {{}}
        return "again", 0.0, False, False, {{}}

    def solution(self):
        return ["abc", "def"]
'''


def workload(tmp: Path, quick: bool) -> tuple[Path, Path]:
    from spade_async.models import tiny_model_dir

    model = tiny_model_dir(tmp / "model", hidden_size=256, num_layers=4)
    pool = tmp / "pool"
    pool.mkdir()
    for i in range(4):
        (pool / f"letters_{i}.py").write_text(ENV.format(i=i))
    return model, pool


def overrides(model: Path, pool: Path, schedule: str, quick: bool) -> list[str]:
    steps = 4 if quick else 8
    return [
        "mode=fixed_pool",
        f"schedule={schedule}",
        f"model={model}",
        f"max_steps={steps}",
        "replay_envs=4",
        "initial_memory=''",
        f"fixed_pool={pool}",
        "checkpoint_every=1000",
        "max_staleness=1",
        "agent.plays_nohint=8",
        "agent.max_turns=2",
        f"agent.max_turn_tokens={16 if quick else 32}",
        "agent.temperature=1.0",
        "trainer.lr=1e-4",
        "trainer.micro_batch_tokens=4096",
        "telemetry.dashboard='off'",
        "telemetry.episodes_per_step=0",
        "envs.max_workers=4",
        "max_concurrent_episodes=32",
        "engine.threads=1",
        "engine.cpus=[0]",
        "placement.trainer_threads=1",
        "placement.trainer_cpus=[1]",
        "pipeline.groups_per_step=4",
        "pipeline.groups_in_flight=4",
        "pipeline.queue_groups=0",
    ]


def run_one(tmp: Path, model: Path, pool: Path, schedule: str, quick: bool) -> dict:
    from spade_async import recipe
    from spade_async.run import train
    from spade_async.rundir import RunDir
    from spade_async.telemetry.metrics import read_metrics

    cfg = recipe.load(None, overrides(model, pool, schedule, quick))
    run_dir = RunDir(tmp / f"run-{schedule}").create()
    run_dir.write_config(cfg)
    t0 = time.perf_counter()
    anyio.run(lambda: train(cfg, run_dir, handle_signals=False))
    total = time.perf_counter() - t0
    last = [r for r in read_metrics(run_dir.metrics) if r["kind"] == "step"][-1]
    busy = {k.split("/", 1)[1]: round(v, 2) for k, v in last.items() if k.startswith("busy_s/")}
    return {
        "wall_s": round(last["time/elapsed_s"], 2),  # first step to last (start-up excluded)
        "total_s_with_startup": round(total, 2),
        "busy_s": busy,
        "steps": last["step"],
        "final_version": last["version"],
        "staleness_dropped": last.get("staleness/dropped", 0),
        "tokens_per_s": {
            k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("tokens_per_s/")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer steps and tokens (under ~2 minutes)"
    )
    ap.add_argument("--save", action="store_true", help="write bench/results/pipeline.json")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tmp = Path(tempfile.mkdtemp(prefix="spade-bench-pipeline-"))
    try:
        model, pool = workload(tmp, args.quick)
        sync = run_one(tmp, model, pool, "sync", args.quick)
        asyn = run_one(tmp, model, pool, "async", args.quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ideal = max(sync["busy_s"].get("engine", 0.0), sync["busy_s"].get("trainer", 0.0))
    speedup = sync["wall_s"] / asyn["wall_s"]
    of_ideal = asyn["wall_s"] / ideal if ideal else float("nan")
    out = {
        "bench": "pipeline",
        "quick": args.quick,
        "hardware": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "placement": "CPU engine pinned to core 0, trainer rank to core 1, 1 torch thread each",
            "python": platform.python_version(),
        },
        "sync": sync,
        "async": asyn,
        "ideal_bound_s": round(ideal, 2),
        "targets": {
            "async_speedup_vs_sync": {
                "target": ">= 1.6",
                "measured": round(speedup, 2),
                "met": speedup >= 1.6,
            },
            "async_wall_over_ideal": {
                "target": "<= 1.25",
                "measured": round(of_ideal, 2),
                "met": of_ideal <= 1.25,
            },
        },
    }
    line = json.dumps(out)
    if args.save:
        (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
        (ROOT / "bench" / "results" / "pipeline.json").write_text(json.dumps(out, indent=2) + "\n")
    print(line)


if __name__ == "__main__":
    main()
