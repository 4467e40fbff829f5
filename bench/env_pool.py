"""Environment pool throughput: pooled sandboxed step vs the bare pipe floor and in-process.

    python bench/env_pool.py [--quick] [--save] [--isolation auto|bwrap|unshare|rlimit]

Measures, at the strongest isolation available (or the one asked for):
- pooled ``step`` round trip (one instance, sequential calls): median, p90, steps/s;
- the floor: ``step`` of an environment that does nothing, sent straight down an idle
  sandboxed worker's pipe (no pool); the target is pooled within 1.5x of it (floor and
  pooled run alternately, in halves, in the same run);
- the same environment's ``step`` called in-process (the reference SPADE's way, no sandbox);
- a fresh sandboxed process per call (boot + load + reset + step + kill): median;
- worker cold start (spawn -> ready) and ``open`` on a cold and on a pre-warmed worker;
- 1, 8 and 64 concurrent instances, all of one environment (one shared worker) and spread
  over 8 environments (8 workers): steps/s, median step latency, instances lost, and the
  workers left alive after the pool closes (must be 0).
The last line printed is one JSON object; ``--save`` also writes bench/results/env_pool.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import anyio
from _hw import emit, machine

from spade_async.envs import protocol as P
from spade_async.envs import sandbox
from spade_async.envs.pool import EnvError, EnvPool, PoolConfig

SOURCE = r'''
import random, re

class MastermindEnv:
    """Find a hidden 4-digit code; feedback gives exact and misplaced digits."""
    def __init__(self, max_turns: int = 1_000_000, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code, self.turn = [rng.randint(0, 5) for _ in range(4)], 0
        return "Guess the 4-digit code (digits 0-5) as \\boxed{dddd}.", {}
    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{([0-5]{4})\}", action)
        if not m:
            return "Format: \\boxed{dddd}", 0.0, False, self.turn >= self.max_turns, {}
        guess = [int(c) for c in m.group(1)]
        exact = sum(g == c for g, c in zip(guess, self.code))
        common = sum(min(guess.count(d), self.code.count(d)) for d in range(6))
        done = exact == 4
        obs = f"{exact} exact, {common - exact} misplaced"
        return obs, 1.0 if done else exact / 8, done, self.turn >= self.max_turns, {"turn": self.turn}
'''
ACTION = "I think it is \\boxed{0123}"
# The floor: an environment that does nothing, asked over the bare worker pipe.
NULL_SOURCE = r"""
class NullEnv:
    def reset(self, seed=None):
        return "", {}
    def step(self, action):
        return "", 0.0, False, False, {}
"""


def hardware(isolation: str) -> dict:
    return {
        **machine(),
        "kernel": platform.release(),
        "isolation": isolation,
        "note": "shared machine: other jobs may run concurrently",
    }


def ms(ns_list: list[int]) -> dict:
    s = sorted(ns_list)
    return {
        "median_ms": round(statistics.median(s) / 1e6, 4),
        "p90_ms": round(s[int(0.9 * (len(s) - 1))] / 1e6, 4),
        "n": len(s),
    }


def in_process(n: int) -> dict:
    ns: dict = {}
    exec(compile(SOURCE, "<bench-env>", "exec"), ns)  # noqa: S102 - our own source
    env = ns["MastermindEnv"]()
    env.reset(seed=0)
    lat = []
    for _ in range(n):
        t = time.perf_counter_ns()
        env.step(ACTION)
        lat.append(time.perf_counter_ns() - t)
    return ms(lat)


async def pooled(pool: EnvPool, n: int) -> dict:
    inst = await pool.open(SOURCE)
    await pool.reset(inst, 0)
    for _ in range(min(200, n)):  # warm-up
        await pool.step(inst, ACTION)
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter_ns()
        await pool.step(inst, ACTION)
        lat.append(time.perf_counter_ns() - t)
    wall = time.perf_counter() - t0
    await pool.close(inst)
    return {**ms(lat), "steps_per_s": round(n / wall)}


async def pipe_floor(pool: EnvPool, n: int) -> dict:
    """The floor of any sandboxed call: one idle sandboxed worker (same isolation and
    limits) answering ``step`` of an environment that does nothing, over its pipe, with no
    pool bookkeeping: framing, msgspec both ways, two pipe hops and the event loop."""
    w = pool.detached_worker()
    await w.start(30)
    try:
        await w.request(P.Open(1, "floor", NULL_SOURCE, {}), 30)
        await w.request(P.Reset(1, 0), 30)
        for _ in range(min(200, n)):  # warm-up
            await w.request(P.Step(1, ACTION), 30)
        lat = []
        for _ in range(n):
            t = time.perf_counter_ns()
            await w.request(P.Step(1, ACTION), 30)
            lat.append(time.perf_counter_ns() - t)
    finally:
        await w.kill("bench done")
    return ms(lat)


async def fresh_per_call(pool: EnvPool, n: int) -> dict:
    """What a call costs when every call gets its own sandboxed process."""
    lat, boot = [], []
    for _ in range(n):
        t = time.perf_counter_ns()
        w = pool.detached_worker()
        await w.start(30)
        boot.append(time.perf_counter_ns() - t)
        await w.request(P.Open(1, "bench", SOURCE, {}), 30)
        await w.request(P.Reset(1, 0), 30)
        await w.request(P.Step(1, ACTION), 30)
        await w.kill("bench done")
        lat.append(time.perf_counter_ns() - t)
    return {**ms(lat), "boot": ms(boot)}


def _merge(a: dict, b: dict) -> dict:
    """Median over both halves (mean of the two medians, equal n), p90 the larger."""
    out = {
        "median_ms": round((a["median_ms"] + b["median_ms"]) / 2, 4),
        "p90_ms": max(a["p90_ms"], b["p90_ms"]),
        "n": a["n"] + b["n"],
    }
    if "steps_per_s" in a:
        out["steps_per_s"] = round((a["steps_per_s"] + b["steps_per_s"]) / 2)
    return out


async def open_times(n: int, isolation: str) -> dict:
    cold, warm = [], []
    async with EnvPool(PoolConfig(isolation=isolation, prewarm=0)) as pool:
        for i in range(n):
            t = time.perf_counter_ns()
            inst = await pool.open(SOURCE + f"\n# cold {i}\n")
            cold.append(time.perf_counter_ns() - t)
            await pool.close(inst)
    async with EnvPool(PoolConfig(isolation=isolation, prewarm=1)) as pool:
        for i in range(n):
            with anyio.fail_after(30):
                while pool.stats()["idle"] < 1:
                    await anyio.sleep(0.005)
            t = time.perf_counter_ns()
            inst = await pool.open(SOURCE + f"\n# warm {i}\n")
            warm.append(time.perf_counter_ns() - t)
            await pool.close(inst)
    return {"open_cold_worker": ms(cold), "open_prewarmed_worker": ms(warm)}


async def concurrent(isolation: str, n: int, envs: int, steps: int) -> dict:
    lost, lat = 0, []
    cfg = PoolConfig(isolation=isolation, prewarm=0, max_workers=max(envs, 1))
    async with EnvPool(cfg) as pool:
        tag_prefix = f"spade-worker-{os.getpid()}-"

        insts = []
        for i in range(n):  # open and reset first, so the timing covers steps only
            insts.append(await pool.open(SOURCE + f"\n# env {i % envs}\n"))
            await pool.reset(insts[-1], i)

        async def play(inst) -> None:
            nonlocal lost
            try:
                for _ in range(steps):
                    t = time.perf_counter_ns()
                    await pool.step(inst, ACTION)
                    lat.append(time.perf_counter_ns() - t)
                await pool.close(inst)
            except EnvError:
                lost += 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for inst in insts:
                tg.start_soon(play, inst)
        wall = time.perf_counter() - t0
        workers = pool.stats()["workers"]
    await anyio.sleep(0.3)  # processes in a pid namespace exit asynchronously
    leaked = len(sandbox.find_pids(tag_prefix))
    return {
        "instances": n, "envs": envs, "workers": workers, "steps_each": steps,
        "steps_per_s": round(n * steps / wall), **ms(lat), "lost": lost, "workers_leaked": leaked,
    }  # fmt: skip


async def run(args: argparse.Namespace) -> dict:
    quick = args.quick
    isolation = sandbox.isolation_level(args.isolation)
    n_steps, n_fresh, n_open, k = (3000, 10, 5, 50) if quick else (30000, 30, 20, 300)
    out: dict = {"name": "env_pool", "quick": quick, "hardware": hardware(isolation)}
    out["in_process_step"] = in_process(n_steps)
    async with EnvPool(PoolConfig(isolation=isolation, prewarm=1)) as pool:
        # floor and pooled alternate in halves, so drift on this shared machine hits both
        half = n_steps // 2
        floor1, pooled1 = await pipe_floor(pool, half), await pooled(pool, half)
        pooled2, floor2 = await pooled(pool, half), await pipe_floor(pool, half)
        out["pipe_floor_step"] = {"halves": [floor1, floor2], **_merge(floor1, floor2)}
        out["pooled_step"] = {"halves": [pooled1, pooled2], **_merge(pooled1, pooled2)}
        out["fresh_process_per_call"] = await fresh_per_call(pool, n_fresh)
    out.update(await open_times(n_open, isolation))
    out["concurrency"] = [
        await concurrent(isolation, n, envs, k)
        for n in (1, 8, 64)
        for envs in sorted({1, min(n, 8)})
    ]
    pooled_ms = out["pooled_step"]["median_ms"]
    floor_ms = out["pipe_floor_step"]["median_ms"]
    over_floor = pooled_ms / floor_ms
    out["pooled_vs_in_process"] = round(pooled_ms / out["in_process_step"]["median_ms"], 1)
    out["fresh_process_vs_pooled"] = round(
        out["fresh_process_per_call"]["median_ms"] / pooled_ms, 1
    )
    c64 = [c for c in out["concurrency"] if c["instances"] == 64]
    out["targets"] = {
        "pooled_step_median_ms": {"target": "<= 0.5", "measured": pooled_ms, "met": pooled_ms <= 0.5},
        "pooled_over_pipe_floor": {"target": "<= 1.5", "measured": round(over_floor, 2), "met": over_floor <= 1.5},
        "instances_lost_at_64": {"target": 0, "measured": sum(c["lost"] for c in c64), "met": all(c["lost"] == 0 for c in c64)},
        "workers_leaked": {"target": 0, "measured": sum(c["workers_leaked"] for c in out["concurrency"]),
                           "met": all(c["workers_leaked"] == 0 for c in out["concurrency"])},
    }  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sample sizes (under a minute)")
    parser.add_argument("--save", action="store_true", help="write bench/results/env_pool.json")
    parser.add_argument("--isolation", default="auto", choices=["auto", *sandbox.LEVELS])
    args = parser.parse_args()
    result = anyio.run(run, args)
    emit(result, "env_pool", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
