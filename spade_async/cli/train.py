"""``spade train CONFIG [--run-dir PATH] [--set k=v ...]``: run SPADE, a baseline or an ablation."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from spade_async import placement, recipe
from spade_async.errors import ConfigError
from spade_async.recipe import read_run_config
from spade_async.rundir import RunDir, default_run_dir


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade train", description=__doc__)
    p.add_argument("config", help="TOML recipe, e.g. configs/cpu-demo.toml")
    p.add_argument(
        "--run-dir", help="run directory (an existing one resumes from its latest checkpoint)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set trainer.lr=1e-6 (repeatable)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the launch plan (every process, its GPUs, its command line) and exit",
    )
    p.add_argument(
        "--gpu",
        default="",
        help="--dry-run: plan memory for this GPU model (h100-80gb, h200-141gb, a100-80gb, ...; "
        "default: the one nvidia-smi finds, else h100-80gb)",
    )
    p.add_argument(
        "--sample-tokens",
        type=int,
        default=0,
        help="--dry-run: plan for a sample of this many tokens (default: the recipe's longest)",
    )
    p.add_argument(
        "--node-rank",
        type=int,
        default=None,
        help="several nodes: this training node's rank (placement.node_rank); a node other "
        "than 0 runs only its trainer ranks",
    )
    args = p.parse_args(argv)
    from spade_async.config_bounds import TOKENS, Range, check_flag

    check_flag("--sample-tokens", Range(1, TOKENS, also=(0,)), args.sample_tokens)  # 0: default
    if args.node_rank is not None:
        args.overrides.append(f"placement.node_rank={args.node_rank}")
    run_dir = RunDir(Path(args.run_dir) if args.run_dir else default_run_dir(args.config))
    if args.dry_run:  # the plan only: nothing is started or created
        cfg = recipe.load(run_dir.config if run_dir.exists() else args.config, args.overrides)
        from spade_async.launch.nodes import describe_node

        print(describe_node(cfg, run_dir.root, gpu=args.gpu, sample_tokens=args.sample_tokens))
        return 0
    if args.node_rank:  # training node R > 0: its torchrun agent only, in the foreground
        from spade_async.launch.nodes import run_node
        from spade_async.models import resolve_model

        cfg = recipe.load(args.config, args.overrides)
        return run_node(cfg, str(resolve_model(cfg.model)), str(run_dir.root))
    if run_dir.exists():  # resume: the saved config is the base, new overrides still apply
        read_run_config(run_dir.config)  # a wrong type: the line report and replay give
        cfg = recipe.load(run_dir.config, args.overrides)
        placement.check_devices(cfg)
    else:
        cfg = recipe.load(args.config, args.overrides)
        placement.check_devices(cfg)  # before the run directory is created
        if run_dir.root.exists() and any(run_dir.root.iterdir()):
            raise ConfigError(
                f"run directory '{run_dir.root}' exists but holds no config.toml; pick another --run-dir"
            )
        run_dir.create().write_config(cfg)
    from spade_async.loop.run import train

    code = anyio.run(train, cfg, run_dir)
    print(f"run directory: {run_dir.root}  (metrics.jsonl, envs/, episodes/, checkpoints/, hf/)")
    return code
