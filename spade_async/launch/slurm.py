"""``spade slurm RECIPE [--run-dir DIR] [--set k=v ...]``: print an sbatch script for the
recipe's node layout (``placement.engine_nodes`` + ``placement.nnodes``). Submit it with
``sbatch``; nothing is started here.

What the script does (prime-rl's layout; no Ray): one task per node. The engine nodes come
first in the allocation; each runs ``placement.engines_per_node`` SGLang servers (TP =
``gpus_per_node / engines_per_node``, on ``engine_port``, ``engine_port + 1``, ...). The
first training node runs the controller (``spade train RECIPE --node-rank 0``), which
attaches to those servers as ``engine.external`` (waiting for their ``/health`` first), puts
the router in front of them when ``engine.router``, and pushes weights over NCCL with
``placement.master_addr`` = its own hostname. Every other training node runs ``spade train
RECIPE --node-rank R`` (its torchrun agent only). Every ``srun`` has ``--kill-on-bad-exit=1``
and the script ends at the first task that exits (``wait -n``), cancelling the rest.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from spade_async import recipe
from spade_async.errors import ConfigError
from spade_async.generation.sglang import SGLangConfig, build_command

__all__ = ["sbatch_script", "main"]


def _engine_command(cfg: recipe.Config, i: int) -> str:
    from spade_async.engines import lora_flags

    pl, eng = cfg.placement, cfg.engine
    tp = pl.gpus_per_node // pl.engines_per_node
    argv, env = build_command(
        SGLangConfig(
            model_path=cfg.model,
            gpu_ids=list(range(i * tp, (i + 1) * tp)),
            port=pl.engine_port + i,
            host="0.0.0.0",
            tp_size=tp,
            mem_fraction_static=eng.mem_fraction_static,
            extra_args=list(eng.extra_args) + lora_flags(cfg.trainer.lora, eng.extra_args),
        )
    )
    argv[0] = "python"  # the engine node's interpreter (the same image)
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"{envs} {shlex.join(argv)}"


def sbatch_script(cfg: recipe.Config, config_path: str, run_dir: str, overrides: list[str]) -> str:
    pl = cfg.placement
    if pl.engine_nodes < 1 and pl.nnodes < 2:
        raise ConfigError(
            f"recipe '{cfg.name}' runs on one node (placement.engine_nodes = 0, nnodes = 1): "
            "run `spade train` there, or set placement.engine_nodes / placement.nnodes"
        )
    if pl.gpus_per_node % pl.engines_per_node:
        raise ConfigError(
            f"placement.engines_per_node = {pl.engines_per_node} does not divide "
            f"gpus_per_node = {pl.gpus_per_node}: each SGLang server gets an equal TP group"
        )
    total = pl.engine_nodes + pl.nnodes
    sets = " ".join(f"--set {shlex.quote(o)}" for o in overrides)
    engines = "\n".join(f"    {_engine_command(cfg, i)} &" for i in range(pl.engines_per_node))
    return f"""#!/bin/bash
#SBATCH --job-name={cfg.name}
#SBATCH --nodes={total}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={pl.gpus_per_node}
#SBATCH --exclusive
# spade slurm {shlex.quote(config_path)}: {pl.engine_nodes} engine node(s) first, then {pl.nnodes} training node(s).
# Ports between nodes: {pl.engine_port}..{pl.engine_port + pl.engines_per_node - 1} (SGLang servers),
# {pl.master_port} (torchrun rendezvous), NCCL's ports (weight push, trainer collectives).
# Multi-NIC hosts: export NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (e.g. ib0) before sbatch.
set -euo pipefail
RECIPE={shlex.quote(config_path)}
RUN_DIR={shlex.quote(run_dir)}   # on a filesystem every node mounts (checkpoints, weights)
mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
ENGINE_HOSTS=("${{HOSTS[@]:0:{pl.engine_nodes}}}")
TRAIN_HOSTS=("${{HOSTS[@]:{pl.engine_nodes}:{pl.nnodes}}}")
MASTER_ADDR="${{TRAIN_HOSTS[0]}}"   # the controller and trainer rank 0
EXTERNAL=""
for h in "${{ENGINE_HOSTS[@]}}"; do
  for i in $(seq 0 {pl.engines_per_node - 1}); do EXTERNAL+="'http://$h:$(({pl.engine_port} + i))',"; done
done
EXTERNAL="[${{EXTERNAL%,}}]"
COMMON=(--run-dir "$RUN_DIR" --set "placement.master_addr='$MASTER_ADDR'" \\
  --set "placement.rdzv_id='$SLURM_JOB_ID'" --set "engine.external=$EXTERNAL" {sets})

for h in "${{ENGINE_HOSTS[@]}}"; do
  srun --nodes=1 --ntasks=1 -w "$h" --kill-on-bad-exit=1 bash -c '
{engines}
    wait -n' &
done
# the controller waits for every engine's /health (large models load for minutes)
for r in $(seq 0 {pl.nnodes - 1}); do
  srun --nodes=1 --ntasks=1 -w "${{TRAIN_HOSTS[$r]}}" --kill-on-bad-exit=1 bash -c '
    if [ "$0" = 0 ]; then
      for u in $(echo "$1" | tr -d "[]'"'"'" | tr "," " "); do
        until curl -sf "$u/health" >/dev/null; do sleep 10; done
      done
    fi
    exec spade train "$2" --node-rank "$0" "${{@:3}}"' "$r" "$EXTERNAL" "$RECIPE" "${{COMMON[@]}}" &
done
status=0
wait -n || status=$?   # the first task to end (the run finished, or anything failed) ends the job
scancel "$SLURM_JOB_ID" 2>/dev/null || true
exit $status
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade slurm", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="TOML recipe with a multi-node layout")
    p.add_argument("--run-dir", default="", help="run directory on a shared filesystem")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    cfg = recipe.load(args.config, args.overrides)
    run_dir = args.run_dir or f"runs/{cfg.name}-$SLURM_JOB_ID"
    sys.stdout.write(sbatch_script(cfg, args.config, run_dir, args.overrides))
    return 0
