"""``spade plan RECIPE --throughput``: the recipe's step time by placement, simulated.

Runs the project's own loop in virtual time (``spade_async/sim``) for every split of the
node's 8 GPUs (2+6, 4+4, 6+2, colocated by default; 3+5 and 5+3 on request) under the sync
schedule and the async one at each ``max_staleness``, prints one table in steady state (the
first and last regeneration windows left out; a row that has not settled says so instead
of a figure), marks the best sync and the best async placement, gives each async row over
the best sync placement and over sync on its own split, and names a placement more than
10% faster than the recipe's own (minutes: ``--jobs N`` runs N simulations at once). A GPU
or model the cost model lacks is refused in one line naming the parameters to supply
(``--costs FILE`` with ``[gpu.NAME]`` / ``[model.NAME]``). How the figures are made and
checked: docs/throughput.md.
"""

from __future__ import annotations

import argparse
import sys

from spade_async.errors import ConfigError


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="spade plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("recipe", help="a recipe TOML (configs/...)")
    ap.add_argument("--throughput", action="store_true", help="simulate step time by placement")
    ap.add_argument("--gpu", default="h100-80gb", help="GPU model (default h100-80gb)")
    ap.add_argument("--costs", default=None, help="a cost file adding [gpu.X] / [model.X]")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="simulated steps per run, 1..1000 (default: each run until steady, <= 65 steps)",
    )
    ap.add_argument("--staleness", default="0,1,2,3", help="max_staleness values (async)")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run at once (processes)")
    ap.add_argument("--splits", default="2+6,4+4,6+2,colocated", help="placements to try")
    ap.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE",
                    help="a recipe override for every run (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.throughput:
        raise ConfigError(
            "spade plan needs --throughput (GPU memory: spade train RECIPE --dry-run --gpu NAME)"
        )
    from spade_async import recipe
    from spade_async.sim import cost_checks
    from spade_async.sim.costs import gpu_costs
    from spade_async.sim.throughput import (
        SPLITS,
        current_split,
        faster_placement,
        format_rows,
        sweep,
    )  # fmt: skip

    steps = cost_checks.steps(args.steps)  # each flag in its range, or one line (exit 2)
    stale = cost_checks.stalenesses(args.staleness)
    splits = cost_checks.splits(args.splits, SPLITS)
    cfg = recipe.load(args.recipe, args.extra)
    # refuse a GPU or model the cost model lacks before minutes of simulation
    gpu_costs(cfg.model, args.gpu, engine_gpus=8, tp=1, trainer_gpus=8, costs_file=args.costs)
    print(f"simulating {args.recipe} on 8 x {args.gpu} (the loop in virtual time) ...",
          file=sys.stderr)  # fmt: skip
    rows = sweep(args.recipe, args.gpu, steps=steps, stalenesses=stale, splits=splits,
                 extra=args.extra, costs_file=args.costs,
                 progress=lambda r: print(".", end="", file=sys.stderr, flush=True),
                 jobs=max(1, args.jobs))  # fmt: skip
    print(file=sys.stderr)
    mine = current_split(cfg)
    print(f"{cfg.name}: 8 x {args.gpu}; the recipe runs {mine}, {cfg.schedule}, "
          f"max_staleness {cfg.max_staleness}")  # fmt: skip
    print(format_rows(rows))
    hint = faster_placement(rows, mine, cfg.schedule, cfg.max_staleness)
    print(hint or "no placement in the table is more than 10% faster than the recipe's own")
    return 0
