"""Two CPU engines behind SGLang's router vs one engine with the same per-engine cores, and
the router's episode stickiness vs the client's own sticky routing.

    python bench/router.py [--quick] [--save] [--model smollm2-135m-instruct]

Each engine is one CPU engine process (``python -m spade_async.generation.server``) pinned
to its own core(s) with as many torch threads. The workload is multi-turn episodes played
concurrently: every turn's prompt is the previous prompt + the reply + a few new tokens,
each reply exactly ``max_new_tokens`` (``ignore_eos``). Phases, same workload, same run:

1. one engine, the client sending to it directly;
2. two engines behind ``sglang_router.launch_router --policy cache_aware``;
3. two engines, the client's own least-loaded sticky routing (``session_key``).

Throughput = all output tokens / wall time of the phase. Prefix reuse is measured where it
is decided: the share of turns after the first that land on the engine that served the
episode's previous turn (the engine whose prefix cache holds it; the CPU engine has no
prefix cache of its own, so this is the routing's share, not a cache hit rate). The engines
are told apart by their starting weight versions ("1", "2").

Targets (issue 14): phase 2 >= 1.7x phase 1 tokens/s; phase 2 prefix reuse >= phase 3's.
Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from _hw import emit, machine  # noqa: E402

from spade_async.engines import EngineConfig, running_engines  # noqa: E402
from spade_async.generation.client import GenerationClient  # noqa: E402
from spade_async.generation.protocol import SamplingParams  # noqa: E402
from spade_async.launch.router import RoutedClient, running_router  # noqa: E402
from spade_async.models import resolve_model  # noqa: E402


async def _play(client, episodes: int, turns: int, new_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    tokens, same, later = 0, 0, 0
    served: dict[str, int] = {}

    async def episode(k: int) -> None:
        nonlocal tokens, same, later
        ids = [rng.randrange(100, 20_000) for _ in range(64)]
        last = None
        for _ in range(turns):
            res = await client.generate(ids, sp, return_logprob=False, session_key=f"e{k}")
            where = (res.weight_version, res.url)
            served[where[0]] = served.get(where[0], 0) + 1
            if last is not None:
                later += 1
                same += where == last
            last = where
            tokens += len(res.output_ids)
            ids = ids + res.output_ids + [rng.randrange(100, 20_000) for _ in range(8)]

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for k in range(episodes):
            tg.start_soon(episode, k)
    wall = time.perf_counter() - t0
    return {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "prefix_reuse": round(same / later, 3) if later else None,
        "turns_per_engine": dict(sorted(served.items())),  # by starting weight version
    }


async def run(args) -> dict:
    model = resolve_model(args.model)
    cores = sorted(os.sched_getaffinity(0))
    per = args.cores_per_engine
    if len(cores) < 2 * per:
        per = max(1, len(cores) // 2)
    sets = [cores[:per], cores[per : 2 * per]]
    log = Path(args.log_dir)
    work = dict(episodes=args.episodes, turns=args.turns, new_tokens=args.new_tokens)

    def cfg(i: int) -> EngineConfig:
        return EngineConfig(kind="cpu", count=1, threads=per, cpus=sets[i], router=True)

    out = {}
    async with (
        running_engines(cfg(0), model, log / "e1", weight_version=1) as a,
        running_engines(cfg(1), model, log / "e2", weight_version=2) as b,
    ):
        urls = [a[0].url, b[0].url]
        async with GenerationClient(urls[:1]) as one:
            await _play(one, 2, 1, 4, seed=99)  # warm-up
            out["one_engine"] = await _play(one, **work, seed=0)
        async with running_router(cfg(0), urls, log) as router:
            async with RoutedClient(router.url, urls) as routed:
                await _play(routed, 2, 1, 4, seed=98)
                out["router_two_engines"] = await _play(routed, **work, seed=0)
        async with GenerationClient(urls) as sticky:
            out["sticky_two_engines"] = await _play(sticky, **work, seed=0)
    out["cores_per_engine"] = per
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--save", action="store_true")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--cores-per-engine", type=int, default=1)
    p.add_argument("--log-dir", default="/tmp/spade-bench-router")
    args = p.parse_args()
    args.episodes, args.turns, args.new_tokens = (8, 2, 16) if args.quick else (16, 4, 32)
    res = anyio.run(run, args)
    one, routed, sticky = (
        res["one_engine"],
        res["router_two_engines"],
        res["sticky_two_engines"],
    )
    speedup = routed["tokens_per_s"] / one["tokens_per_s"]
    reuse_ok = (routed["prefix_reuse"] or 0) >= (sticky["prefix_reuse"] or 0)
    for name in ("one_engine", "router_two_engines", "sticky_two_engines"):
        print(f"{name:>20}: {res[name]}")
    out = {
        "bench": "router",
        "hardware": {
            **machine(),
            "cores_per_engine": res["cores_per_engine"],
            "device": "cpu",
            "note": "shared machine; compare ratios",
        },
        "workload": {
            "model": args.model,
            "episodes": args.episodes,
            "turns": args.turns,
            "new_tokens": args.new_tokens,
        },
        "phases": {k: res[k] for k in ("one_engine", "router_two_engines", "sticky_two_engines")},
        "targets": {
            "router_speedup_2_engines": {
                "target": ">= 1.7x one engine's tokens/s",
                "measured": round(speedup, 3),
                "met": bool(speedup >= 1.7),
            },
            "router_prefix_reuse_vs_sticky": {
                "target": ">= the client's sticky routing",
                "measured": {"router": routed["prefix_reuse"], "sticky": sticky["prefix_reuse"]},
                "met": bool(reuse_ok),
            },
        },
    }
    emit(out, "router", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
