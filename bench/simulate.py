"""The node in virtual time: the project's own loop on simulated engines, trainer and
environments (``spade_async/sim``), three checks in one run.

1. Held-out validation (``sim/heldout.py``): ``bench/pipeline.py``'s saved walls predicted
   from costs not measured on what is predicted: each run's async wall from its sync arm
   (plus the engine's async contention measured on the other runs), each workload from the
   other's per-unit costs, the max_staleness 2 run too; the table with each error.
2. The controller at scale: the 8B games recipe at the paper's 24 environments x 16+16
   plays (up to 25 turns) and the 30B tool-use recipe, 20 steps each under the async
   schedule, a real Hugging Face tokenizer and chat template in the path (the embedded
   SmolLM2's, a stand-in), route decoding added for MoE: CPU per step, memory, staleness.
3. Placement: the 8B games recipe on 8 x H100, every split and max_staleness, in steady
   state (``sim/throughput.py``: the first and last regeneration windows left out, steady
   when one more window moves the mean and the ratio < 2%; by default each row runs window
   after window until steady, up to --cap steps, and reports the steps used); the headline is async at
   max_staleness <= 2 over the best sync placement at equal GPUs (colocated included),
   same-split beside it, AReaL's 2.77x (over its own sync) named beside that.

    python bench/simulate.py [--quick] [--save] [--steps auto|N] [--cap N] [--staleness 0,1,2,3]

The simulation is repeatable: the same command gives the same virtual-time figures, run to
run and under any --jobs (only the real CPU and memory figures vary).

--quick: the held-out table, 5 steps at scale, 4+4 and colocated at 9 steps (too short
for a steady state: the rows say so). The last line printed is one JSON object: hardware,
the command, and each target with measured and met.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _hw import machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

STALENESS = "0,1,2,3"
SPLITS = ("2+6", "4+4", "5+3", "6+2", "colocated")
AREAL_SPEEDUP = 2.77  # AReaL (arXiv 2505.24298): async over its own sync mode
RECIPE_8B = ROOT / "configs" / "qwen3-8b-games.toml"
RECIPE_30B = ROOT / "configs" / "qwen3-30b-a3b-tool-use.toml"
PAPER_SCALE = ["agent.plays_per_env='fixed'", "agent.plays_nohint=16", "agent.plays_hint=16"]


def validate() -> list[dict]:
    """The held-out table (``sim/heldout.py``): each prediction from costs not measured on
    the arm or the workload it predicts."""
    from spade_async.sim.heldout import format_heldout, heldout_table

    rows = heldout_table(ROOT)
    print(format_heldout(rows), file=sys.stderr, flush=True)
    return rows


def heldout_targets(rows: list[dict]) -> dict:
    """The two validation targets, measured from the held-out rows (``sim/heldout.py``)."""
    from spade_async.sim.heldout import heldout_targets as targets

    return targets(rows)


TOKENIZER = "smollm2-135m-instruct"  # the embedded model's: a stand-in for Qwen3's


def route_decode(cfg, sim: dict) -> dict | None:
    """The controller's route decoding (MoE, routing replay) for the rows the run decoded:
    the CPU per row measured here (``sim/extras.py``) x the decoded tokens (a lower bound:
    each later turn's new prompt rows come too)."""
    from spade_async.plan.shapes import model_shape
    from spade_async.sim.extras import route_decode_s_per_row

    shape = model_shape(cfg.model)
    if not (shape and shape.experts and cfg.trainer.routing_replay):
        return None
    per_row = route_decode_s_per_row(shape.layers, shape.experts_per_tok, shape.experts)
    rows = sim["decoded_tokens"] / max(1, sim["steps"])
    return {"s_per_row": per_row, "rows_per_step": round(rows),
            "s_per_step": round(per_row * rows, 3)}  # fmt: skip


def tokenizer_spots(steps: int) -> dict:
    """The run's tokenizer CPU per step by kind and caller, and its calls per step
    (``sim/parts.RealTokenizerInPath.cpu``), largest first."""
    from spade_async.sim.parts import RealTokenizerInPath

    cpu = RealTokenizerInPath.last.cpu if RealTokenizerInPath.last else {}
    rows = sorted(cpu.items(), key=lambda kv: -kv[1][1])
    return {k.replace(" < ", "/"): {"s": round(s / max(1, steps), 3),
                                    "calls": round(n / max(1, steps))}
            for k, (n, s) in rows}  # fmt: skip


def at_scale(path: Path, steps: int, extra: list[str], gpu: str = "h100-80gb",
             real_tokenizer: bool = True) -> dict:  # fmt: skip
    """The recipe at scale; ``real_tokenizer``: the embedded model's Hugging Face tokenizer
    and chat template in the controller's path (``sim/parts.RealTokenizerInPath``)."""
    from spade_async import recipe
    from spade_async.models import load_tokenizer
    from spade_async.sim.costs import gpu_costs
    from spade_async.sim.runtime import simulate

    cfg = recipe.load(path, extra)
    tp = len(cfg.engine.gpus[0])
    costs = gpu_costs(cfg.model, gpu, engine_gpus=sum(len(g) for g in cfg.engine.gpus), tp=tp,
                      trainer_gpus=len(cfg.placement.trainer_gpus),
                      mem_fraction=cfg.engine.mem_fraction_static)  # fmt: skip
    tok = load_tokenizer(TOKENIZER) if real_tokenizer else None
    t0 = time.perf_counter()
    sim = simulate(cfg, costs, steps, tokenizer=tok)
    routes = route_decode(cfg, sim)
    loop_cpu = sim["controller_cpu_s"] / max(1, sim["steps"])
    spots = tokenizer_spots(sim["steps"]) if real_tokenizer else {}
    ages = sim["max_ages"]
    versions = sim["versions"]
    return {
        "recipe": path.name,
        "overrides": extra,
        "steps": sim["steps"],
        "real_s": round(time.perf_counter() - t0, 1),
        "tokenizer": f"{TOKENIZER} (Hugging Face, with its chat template; a stand-in)"
        if real_tokenizer
        else "simulated (4 characters a token)",
        "loop_cpu_s_per_step": round(loop_cpu, 3),
        # of it, the real tokenizer's: "encode|render|decode/the controller's caller"
        "tokenizer_cpu_s_per_step": spots,
        "route_decoding": routes,
        # the loop's own CPU plus what the loop does not run here (route decoding)
        "controller_cpu_s_per_step": round(loop_cpu + (routes["s_per_step"] if routes else 0), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
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


def placement(gpu: str, quick: bool, path: Path = RECIPE_8B, full: bool = True,
              steps: int = 0, stalenesses=(0, 1, 2, 3), splits=None, jobs: int = 1,
              extra: tuple[str, ...] = (), cap: int = 0, settle: int = 2) -> dict:  # fmt: skip
    """``path``'s table on 8 x ``gpu`` in steady state (``sim/throughput.py``); ``full``:
    ``stalenesses``, else the recipe's own. ``steps`` 0: each row until steady, at most
    ``cap`` steps. ``quick``: 4+4 and colocated at max_staleness 1, 9 steps: too short for a
    steady state, which the rows say."""
    from dataclasses import asdict

    from spade_async import recipe
    from spade_async.sim.throughput import current_split, faster_placement, format_rows, sweep

    cfg = recipe.load(path, [])
    kw = ({"splits": ("4+4", "colocated"), "stalenesses": (1,), "steps": 9} if quick
          else {"steps": steps, "stalenesses": tuple(stalenesses), "cap": cap, "settle": settle,
                "splits": tuple(splits or SPLITS)})  # fmt: skip
    if not full:
        kw["stalenesses"] = (cfg.max_staleness,)
    rows = sweep(path, gpu, jobs=jobs, extra=list(extra), **kw)
    table = format_rows(rows)
    hint = faster_placement(rows, current_split(cfg), cfg.schedule, cfg.max_staleness)
    print(f"{path.stem} on 8 x {gpu}\n{table}\n{hint}", file=sys.stderr, flush=True)
    return {"recipe": path.name, "gpu": gpu, "rows": [asdict(r) for r in rows], "table": table,
            "recipe_split": current_split(cfg), "faster": hint,
            "steps": max((r.steps for r in rows), default=0),
            "steps_mode": "fixed" if quick or steps else "auto",
            "cap": max((r.cap for r in rows), default=0), "settle": settle}  # fmt: skip


def headline(rows: list[dict], max_staleness: int = 2) -> dict:
    """The best async row at ``max_staleness`` or less over the best sync placement (equal
    GPUs, colocated included), the same-split ratio beside it, and the ratio against steps."""
    ok = [r for r in rows if r["schedule"] == "async" and r["over_best_sync"]
          and r["staleness"] <= max_staleness]  # fmt: skip
    if not ok:
        return {"over_best_sync": None, "why": "no steady async row (more steps)"}
    best = min(ok, key=lambda r: r["step_s"])
    return {"split": best["split"], "max_staleness": best["staleness"],
            "step_s": round(best["step_s"], 1), "best_sync": best["best_sync"],
            "over_best_sync": round(best["over_best_sync"], 3),
            "over_same_split_sync": round(best["over_sync"], 3) if best["over_sync"] else None,
            "ratio_by_steps": best["ratio_by_steps"], "max_sample_age": best["max_sample_age"],
            "areal_over_its_own_sync": AREAL_SPEEDUP}  # fmt: skip


GPU_RECIPES = ("qwen3-4b-games", "qwen3-4b-tool-use", "qwen3-8b-games", "qwen3-8b-tool-use",
               "qwen3-30b-a3b-games", "qwen3-30b-a3b-tool-use")  # fmt: skip


def all_recipes() -> None:
    """Every GPU recipe on 8 x H100 and 8 x H200, its own max_staleness, in steady state
    (``--recipes``; long)."""
    out = []
    for name in GPU_RECIPES:
        for gpu in ("h100-80gb", "h200-141gb"):
            path = ROOT / "configs" / f"{name}.toml"
            out.append(placement(gpu, False, path, full=False))
            saved = ROOT / "bench" / "results" / "simulate_recipes.json"
            saved.write_text(json.dumps({"hardware": machine(), "tables": out}, indent=2) + "\n")
    print(json.dumps({"bench": "simulate_recipes", "tables": len(out)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="under a minute")
    ap.add_argument("--save", action="store_true", help="write bench/results/simulate.json")
    ap.add_argument(
        "--steps",
        default="auto",
        help="steps per placement run; auto (the default): each row window after window "
        "until steady, at most --cap steps",
    )
    ap.add_argument("--settle", type=int, default=2,
                    help="auto: windows in a row that must each move a row's mean < 2%%")  # fmt: skip
    ap.add_argument("--cap", type=int, default=0,
                    help="auto's most steps a row runs (default: 16 regeneration windows + 1)")  # fmt: skip
    ap.add_argument("--staleness", default=STALENESS, help="max_staleness values (async)")
    ap.add_argument("--splits", default=",".join(SPLITS), help="placements to simulate")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        dest="extra",
        metavar="KEY=VALUE",
        help="a recipe override for every placement run (repeatable)",
    )
    ap.add_argument("--tag", default="", help="saved as simulate_PART_TAG.json")
    ap.add_argument("--scale-steps", type=int, default=20, help="steps of each run at scale")
    ap.add_argument("--jobs", type=int, default=1, help="placement simulations run at once")
    ap.add_argument(
        "--part",
        choices=("all", "scale", "placement"),
        default="all",
        help="scale or placement alone (saved as simulate_PART.json)",
    )
    ap.add_argument("--recipes", action="store_true",
                    help="every GPU recipe's table on H100 and H200 (its own max_staleness), "
                    "saved as bench/results/simulate_recipes.json; long")  # fmt: skip
    args = ap.parse_args()
    if args.steps != "auto" and not (args.steps.isdigit() and int(args.steps) > 0):
        ap.error(f"--steps {args.steps!r}: give auto or a positive whole number of steps")
    steps_n = 0 if args.steps == "auto" else int(args.steps)
    if args.recipes:
        all_recipes()
        return
    t0 = time.perf_counter()
    pred = validate()
    steps = 5 if args.quick else args.scale_steps  # quick: a regeneration window and a step
    do_scale, do_place = args.part in ("all", "scale"), args.part in ("all", "placement")
    scale_8b = at_scale(RECIPE_8B, steps, PAPER_SCALE) if do_scale else None
    scale_30b = None if args.quick or not do_scale else at_scale(RECIPE_30B, steps, [])
    tables = (
        []
        if not do_place
        else [
            placement(
                "h100-80gb",
                args.quick,
                steps=steps_n,
                cap=args.cap,
                settle=args.settle,
                stalenesses=[int(x) for x in args.staleness.split(",")],
                splits=tuple(x.strip() for x in args.splits.split(",") if x.strip()),
                jobs=args.jobs,
            )
        ]
    )
    head = headline(tables[0]["rows"]) if tables else {}
    ctl = scale_8b["controller_cpu_s_per_step"] if scale_8b else None
    ratio = head.get("over_best_sync")
    out = {
        "bench": "simulate",
        "command": "python bench/simulate.py"
        + (" --quick" if args.quick else "")
        + (f" --steps {args.steps}" if steps_n else "")
        + (f" --cap {args.cap}" if args.cap else "")
        + (f" --settle {args.settle}" if args.settle != 2 else "")
        + (f" --staleness {args.staleness}" if args.staleness != STALENESS else "")
        + (f" --splits {args.splits}" if args.splits != ",".join(SPLITS) else "")
        + (f" --part {args.part}" if args.part != "all" else "")
        + (f" --jobs {args.jobs}" if args.jobs > 1 else "")
        + (f" --scale-steps {args.scale_steps}" if args.scale_steps != 20 else "")
        + "".join(f" --set {x}" for x in args.extra)
        + (f" --tag {args.tag}" if args.tag else "")
        + (" --save" if args.save else ""),
        "quick": args.quick,
        "hardware": machine(),
        "total_s": round(time.perf_counter() - t0, 1),
        "heldout": pred,
        "scale": [s for s in (scale_8b, scale_30b) if s],
        "placement": tables,
        "headline": head,
        "targets": {
            **heldout_targets(pred),  # sim/heldout.py
            "async_over_best_sync_at_staleness_le_2": {
                "target": ">= 2.0x steady state, 8B games on 8 x H100 (AReaL's 2.77x is over "
                "its own sync, not its best placement)",
                "measured": ratio,
                "met": bool(ratio and ratio >= 2.0),
            },
            "controller_cpu_per_step": {
                "target": "<= 2 s CPU a step at 24 envs x 16+16 plays, real tokenizer in the path",
                "measured": ctl,
                "load_avg_1m": scale_8b["load_avg_1m"] if scale_8b else None,
                "met": bool(ctl is not None and ctl <= 2.0),
            },
        },
    }
    if not do_scale:
        del out["targets"]["controller_cpu_per_step"]
    if not do_place:
        del out["targets"]["async_over_best_sync_at_staleness_le_2"]
    if args.save:
        name = ("simulate_quick.json" if args.quick else "simulate.json" if args.part == "all"
                else f"simulate_{args.part}{'_' + args.tag if args.tag else ''}.json")  # fmt: skip
        (ROOT / "bench" / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
