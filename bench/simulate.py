"""The node in virtual time: the project's own loop on simulated engines, trainer and
environments (``spade_async/sim``), three checks in one run.

1. Validation: with costs measured on this machine (``bench/pipeline.py``'s saved stage
   timings, ``sim/calibrate.py``), predict that bench's measured sync and async walls for
   two_stage and three_stage (each phase simulated from an empty pipeline, as measured).
2. The controller at scale: the 8B games recipe at the paper's 24 environments x 16+16
   plays (up to 25 turns) and the 30B tool-use recipe, 20 steps each under the async
   schedule: the controller's real CPU per step and peak memory, queue depths, staleness.
3. Placement: the 8B games recipe on 8 x H100 and 8 x H200, every split and max_staleness
   0-3 (``spade plan RECIPE --throughput``'s table), async over sync beside AReaL's 2.77x.

    python bench/simulate.py [--quick] [--save]

--quick (under a minute): the validation, 5 steps at scale, the recipe's own split only.
The last line printed is one JSON object: hardware, and each target with measured and met.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec
from _hw import machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

AREAL_SPEEDUP = 2.77  # AReaL (arXiv 2505.24298): async over its own sync mode
RECIPE_8B = ROOT / "configs" / "qwen3-8b-games.toml"
RECIPE_30B = ROOT / "configs" / "qwen3-30b-a3b-tool-use.toml"
PAPER_SCALE = ["agent.plays_per_env='fixed'", "agent.plays_nohint=16", "agent.plays_hint=16"]


def validate() -> dict:
    """Predicted vs measured walls of bench/pipeline.py's saved runs."""
    import pipeline as P

    from spade_async import recipe
    from spade_async.sim.calibrate import cpu_costs
    from spade_async.sim.runtime import simulate

    out = {}
    for name in ("pipeline", "pipeline_three_stage"):
        saved = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
        w = saved["workload"]
        three, stale = w["name"] == "three_stage", w["max_staleness"]
        cfg = recipe.load(None, P.overrides(ROOT, ROOT, False, P.lookahead_steps(three, stale),
                                            stale, 0))  # fmt: skip
        costs = cpu_costs(saved)
        for sched in ("sync", "async"):
            phases = saved[sched]["phases"]
            per_phase = saved[sched]["steps"] // phases
            sim = simulate(msgspec.structs.replace(cfg, schedule=sched), costs, per_phase)
            predicted = sim["wall_s"] * phases
            measured = saved[sched]["wall_s"]
            out[f"{w['name']}_{sched}"] = {
                "measured_wall_s": measured,
                "predicted_wall_s": round(predicted, 2),
                "error": round(predicted / measured - 1, 3),
                "max_sample_age": sim["max_sample_age"],
            }
    return out


def at_scale(path: Path, steps: int, extra: list[str], gpu: str = "h100-80gb") -> dict:
    from spade_async import recipe
    from spade_async.sim.costs import gpu_costs
    from spade_async.sim.runtime import simulate

    cfg = recipe.load(path, extra)
    tp = len(cfg.engine.gpus[0])
    costs = gpu_costs(cfg.model, gpu, engine_gpus=sum(len(g) for g in cfg.engine.gpus), tp=tp,
                      trainer_gpus=len(cfg.placement.trainer_gpus),
                      mem_fraction=cfg.engine.mem_fraction_static)  # fmt: skip
    t0 = time.perf_counter()
    sim = simulate(cfg, costs, steps)
    ages = sim["max_ages"]
    versions = sim["versions"]
    return {
        "recipe": path.name,
        "overrides": extra,
        "steps": sim["steps"],
        "real_s": round(time.perf_counter() - t0, 1),
        "controller_cpu_s_per_step": round(sim["controller_cpu_s"] / max(1, sim["steps"]), 3),
        # with the simulated engines' own CPU (their scheduling, encoding replies)
        "process_cpu_s_per_step": round(sim["process_cpu_s"] / max(1, sim["steps"]), 3),
        "peak_rss_mib": round(sim["peak_rss_mib"], 1),
        # the process's peak grew this much over the run (imports and the first runs before)
        "rss_growth_mib": round(sim["rss_growth_mib"], 1),
        "virtual_s_per_step": round(sim["wall_s"] / max(1, sim["steps"]), 1),
        "episodes": sim["episodes"],
        "decoded_tokens": sim["decoded_tokens"],
        "max_groups_buffered": sim["max_groups_buffered"],
        "max_memory_queue": sim["max_memory_queue"],
        "staleness_dropped": sim["staleness_dropped"],
        "max_sample_age": max(ages, default=0),
        "versions_in_order": versions == list(range(1, len(versions) + 1)),
        "engine_busy_share": round(sim["engine_busy_share"], 3),
        "engine_mean_batch": round(sim["engine_mean_batch"], 1),
        "trainer_busy_share": round(sim["trainer_busy_share"], 3),
    }


def placement(
    gpu: str, quick: bool, path: Path = RECIPE_8B, full: bool = True, steps: int = 13
) -> dict:
    """``path``'s table on 8 x ``gpu``; ``full``: max_staleness 0-3, else the recipe's own."""
    from dataclasses import asdict

    from spade_async import recipe
    from spade_async.sim.throughput import current_split, faster_placement, format_rows, sweep

    cfg = recipe.load(path, [])
    kw = {"splits": ("4+4",), "stalenesses": (1,), "steps": 3} if quick else {"steps": steps}
    if not full:
        kw["stalenesses"] = (cfg.max_staleness,)
    rows = sweep(path, gpu, **kw)
    table = format_rows(rows)
    hint = faster_placement(rows, current_split(cfg), cfg.schedule, cfg.max_staleness)
    print(f"{path.stem} on 8 x {gpu}\n{table}\n{hint}", file=sys.stderr, flush=True)
    return {"recipe": path.name, "gpu": gpu, "rows": [asdict(r) for r in rows], "table": table,
            "recipe_split": current_split(cfg), "faster": hint}  # fmt: skip


GPU_RECIPES = ("qwen3-4b-games", "qwen3-4b-tool-use", "qwen3-8b-games", "qwen3-8b-tool-use",
               "qwen3-30b-a3b-games", "qwen3-30b-a3b-tool-use")  # fmt: skip


def all_recipes() -> None:
    """Every GPU recipe on 8 x H100 and 8 x H200, its own max_staleness, 9 steps each
    (``--recipes``)."""
    out = []
    for name in GPU_RECIPES:
        for gpu in ("h100-80gb", "h200-141gb"):
            path = ROOT / "configs" / f"{name}.toml"
            out.append(placement(gpu, False, path, full=False, steps=9))
            saved = ROOT / "bench" / "results" / "simulate_recipes.json"
            saved.write_text(json.dumps({"hardware": machine(), "tables": out}, indent=2) + "\n")
    print(json.dumps({"bench": "simulate_recipes", "tables": len(out)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="under a minute")
    ap.add_argument("--save", action="store_true", help="write bench/results/simulate.json")
    ap.add_argument("--recipes", action="store_true",
                    help="every GPU recipe's table on H100 and H200 (its own max_staleness), "
                    "saved as bench/results/simulate_recipes.json; long")  # fmt: skip
    args = ap.parse_args()
    if args.recipes:
        all_recipes()
        return
    t0 = time.perf_counter()
    pred = validate()
    steps = 5 if args.quick else 20  # quick: one regeneration window and the next step
    scale_8b = at_scale(RECIPE_8B, steps, PAPER_SCALE)
    scale_30b = None if args.quick else at_scale(RECIPE_30B, steps, [])
    tables = [placement("h100-80gb", args.quick)]
    if not args.quick:
        tables.append(placement("h200-141gb", False))
    h100 = tables[0]["rows"]
    best_async = max((r["over_sync"] or 0.0) for r in h100)
    own = [r for r in h100 if r["split"] == "4+4" and r["schedule"] == "async"
           and r["staleness"] == 1]  # fmt: skip
    worst = max(abs(v["error"]) for v in pred.values())
    out = {
        "bench": "simulate",
        "quick": args.quick,
        "hardware": machine(),
        "total_s": round(time.perf_counter() - t0, 1),
        "validation": pred,
        "scale": [s for s in (scale_8b, scale_30b) if s],
        "placement": tables,
        "targets": {
            "prediction_within_10pct": {
                "target": "|predicted / measured - 1| <= 0.10 for bench/pipeline.py's two_stage "
                "and three_stage, sync and async",
                "measured": worst,
                "met": worst <= 0.10,
            },
            "controller_cpu_per_step": {
                "target": "< 2 s real CPU per simulated step at 24 envs x 16+16 plays, <= 25 turns",
                "measured": scale_8b["controller_cpu_s_per_step"],
                "met": scale_8b["controller_cpu_s_per_step"] < 2.0,
            },
            "placement_table_8b_h100": {
                "target": f"async over sync reported beside AReaL's {AREAL_SPEEDUP}x",
                "measured": {
                    "recipe_4+4_staleness_1": own[0]["over_sync"] if own else None,
                    "best": round(best_async, 2),
                    "areal": AREAL_SPEEDUP,
                },
                "met": bool(own and own[0]["over_sync"]),
            },
        },
    }
    if args.save:
        name = "simulate_quick.json" if args.quick else "simulate.json"
        (ROOT / "bench" / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
