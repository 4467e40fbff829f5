"""Several nodes: what training node R runs. The layout is ``[placement] nnodes, node_rank,
master_addr, master_port`` (checked in ``layout.py``).

``engine_nodes`` nodes run only SGLang servers (attached as ``engine.external``, see
``slurm.py``); ``nnodes`` training nodes each run ``len(trainer_gpus)`` FSDP ranks under one
torchrun agent; training node 0 also runs the controller (event loop, memory, sandboxes,
the router when ``engine.router``). Node R > 0 runs only its torchrun agent
(``spade train RECIPE --node-rank R``). ``trainer.hsdp = true`` shards within a node and
replicates across nodes.

A rank lost on another node breaks the collectives of the ranks here at once (the TCP
connection closes), the local rank exits, torchrun tears the group down, and the
controller's trainer-restart policy takes over (``runtime.restart_trainer``); node R's
agent is started again and rejoins (``run_node``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spade_async.recipe import Config

__all__ = ["node_roles", "describe_node", "run_node"]


def node_roles(cfg: Config) -> list[str]:
    """What node ``placement.node_rank`` runs, one line each."""
    pl, eng = cfg.placement, cfg.engine
    ranks = len(pl.trainer_gpus) or pl.cpu_ranks
    lines = [
        f"layout: {pl.engine_nodes} engine node(s), {pl.nnodes} training node(s); this is "
        f"training node {pl.node_rank}",
        f"trainer: torchrun agent with {ranks} rank(s) ({'GPUs ' + ','.join(map(str, pl.trainer_gpus)) if pl.trainer_gpus else 'CPU, gloo'}), "
        f"global ranks {pl.node_rank * ranks}..{(pl.node_rank + 1) * ranks - 1} under static "
        "numbering"
        + ("; HSDP: shard within this node, replicate across nodes" if cfg.trainer.hsdp else ""),
    ]
    if pl.node_rank == 0:
        lines.append("controller: this node (event loop, memory, sandboxes, dashboard)")
        if eng.external:
            lines.append(f"external engines: {', '.join(eng.external)} (attached, left running)")
        if eng.router:
            lines.append(f"router: sglang_router.launch_router ({eng.router_policy}) on this node")
    else:
        lines.append("controller, engines, router: on training node 0, not here")
    return lines


def describe_node(cfg: Config, run_dir, **plan) -> str:
    """``spade train RECIPE --dry-run [--node-rank R]``: node 0 gets the whole launch plan
    (controller, engines, router, its trainer agent); node R > 0 its trainer agent only."""
    from spade_async.placement import describe, trainer_process

    pl = cfg.placement
    several = pl.nnodes > 1 or pl.engine_nodes > 0 or bool(cfg.engine.external)
    head = [f"node plan: {line}" for line in node_roles(cfg)] if several else []
    if pl.node_rank == 0:
        return "\n".join([*head, describe(cfg, run_dir, **plan)])
    proc = trainer_process(cfg, cfg.model, run_dir)
    env = " ".join(f"{k}={v}" for k, v in proc.env.items())
    return "\n".join([*head, "commands:", f"  trainer: {env} {' '.join(proc.cmd)}"])


def run_node(cfg: Config, model_dir: str, run_dir: str, *, load: str | None = None) -> int:
    """Training node R > 0: run this node's torchrun agent in the foreground. It exits 0 when
    the run ends; when a rank anywhere died it exits non-zero and is started again (up to
    ``trainer_restarts`` times) to rejoin the rendezvous of node 0's restarted trainer."""
    from spade_async.placement import trainer_process
    from spade_async.rundir import RunDir

    node, code = cfg.placement.node_rank, 1
    for attempt in range(cfg.trainer_restarts + 1):
        # every rank loads what node 0 loads: the latest checkpoint on the shared run dir
        latest = RunDir(Path(run_dir)).latest_checkpoint()
        proc = trainer_process(
            cfg, model_dir, run_dir, load=str(latest[1]) if latest is not None else load
        )
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        env.update(proc.env)
        print(f"training node {node} (start {attempt + 1}): {' '.join(proc.cmd)}", file=sys.stderr)
        code = subprocess.run(proc.cmd, env=env, check=False).returncode
        if code == 0:
            return 0
    return code
