"""Environment sources by scheme: the reasoning-gym pool through the gates, and import speed.

    python bench/interop.py [--quick] [--save]

1. The 24 reasoning-gym datasets of configs/qwen3-8b-rg-fixed-pool.toml imported into a fresh
   memory (``import_files``: entries made in a child, then every environment through the
   validation gates in the sandbox, reasoning-gym bound): the share that passes (target
   >= 95%), each failure named with its stage and reason.
2. 1,000 reasoning-gym items (4 datasets x 250) imported into memory: wall-clock seconds from
   the value to the stored records (target < 60 s on this machine's cores).

--quick: 50 problems per dataset in (1) instead of the recipe's 500. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _hw import emit, machine  # noqa: E402

THOUSAND = "rg:basic_arithmetic,leg_counting,chain_sum,count_bits?size=250"


def _entries(code: str) -> int:
    """How many reasoning-gym entries an rg: environment source holds (its ENTRIES literal)."""
    import ast

    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ENTRIES":
            return len(ast.literal_eval(node.value))
    return 0


def _import(value: str):
    import anyio

    from spade_async.memory.importer import import_files, preload
    from spade_async.memory.store import MemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        loaded = preload(value)
        with MemoryStore(Path(tmp) / "memory.lmdb") as store:
            outcomes = anyio.run(lambda: import_files(store, loaded))
        return time.perf_counter() - t0, outcomes, loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    from spade_async import recipe
    from spade_async.envs.sources import parse

    cfg = recipe.load(ROOT / "configs" / "qwen3-8b-rg-fixed-pool.toml")
    src = parse(cfg.fixed_pool)
    names = src.target.split(",")
    size = 50 if args.quick else int(src.options.get("size", 500))
    secs, outcomes, _ = _import(f"rg:{','.join(names)}?size={size}")
    passed = [o for o in outcomes if o.outcome == "accepted"]
    made = {o.path.split("?")[0][3:] for o in outcomes}
    failures = [
        f"{o.path}: {o.stage}: {o.reason[:200]}" for o in outcomes if o.outcome != "accepted"
    ]
    failures += [
        f"rg:{n}: no entry survived (see the import's notes)" for n in names if n not in made
    ]
    share = len(passed) / len(names)

    t_secs, t_outcomes, loaded = _import(THOUSAND)
    items, notes = loaded.items, loaded.notes
    n_items = sum(_entries(i.code) for i in items)
    t_ok = all(o.outcome == "accepted" for o in t_outcomes)
    out = {
        "bench": "interop",
        "hardware": machine(),
        "load_average": os.getloadavg(),
        "pool": {
            "datasets": len(names),
            "problems_each": size,
            "seconds": round(secs, 1),
            "failures": failures,
        },  # fmt: skip
        "thousand": {
            "value": THOUSAND,
            "items": n_items,
            "environments": len(items),
            "accepted": sum(o.outcome == "accepted" for o in t_outcomes),
            "seconds": round(t_secs, 1),
            "left_out": len(notes),
        },  # fmt: skip
        "targets": {
            "rg_pool_gate_pass_rate": {
                "target": ">= 0.95",
                "measured": round(share, 3),
                "met": share >= 0.95,
            },  # fmt: skip
            "import_1000_items_s": {
                "target": "< 60",
                "measured": round(t_secs, 1),
                "met": t_secs < 60 and t_ok and n_items >= 1000,
            },  # fmt: skip
        },
    }
    emit(out, "interop", args.save)


if __name__ == "__main__":
    main()
