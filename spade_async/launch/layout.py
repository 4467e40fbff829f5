"""The multi-node layout's leaf pieces: its checks, torchrun's rendezvous arguments and the
HSDP device mesh. Imported by ``placement.py`` and the trainer; imports neither (what each
node runs is ``nodes.py``).

Rendezvous: ``torchrun --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint
master_addr:master_port --rdzv-id ID``. With c10d torch ignores ``--node-rank`` and numbers
the nodes by their sorted (address, pid): global rank 0 (which serves the controller's
socket) is on the node whose address sorts first. SLURM lists hostnames sorted and
``spade slurm`` makes the first training host node 0; elsewhere set
``rdzv_backend = "static"``, which numbers nodes by ``node_rank``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from spade_async.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from spade_async.engines import EngineConfig
    from spade_async.launch.config import PlacementConfig

__all__ = ["check_layout", "torchrun_rdzv", "hsdp_mesh"]


def check_layout(
    pl: PlacementConfig, eng: EngineConfig, push_mode: str, *, hsdp: bool = False
) -> None:
    """A layout whose counts, ranks or addresses disagree: one line (``push_mode``: what
    ``placement.weight_push`` resolves to; ``hsdp``: ``trainer.hsdp``)."""
    from spade_async.launch.external import check_urls

    check_urls(eng.external)
    if pl.nnodes < 1 or pl.engine_nodes < 0:
        raise ConfigError(
            f"placement.nnodes = {pl.nnodes}, engine_nodes = {pl.engine_nodes}: "
            "need nnodes >= 1 training node and engine_nodes >= 0"
        )
    if not 0 <= pl.node_rank < pl.nnodes:
        raise ConfigError(
            f"placement.node_rank = {pl.node_rank} but nnodes = {pl.nnodes}: "
            f"node ranks are 0..{pl.nnodes - 1}"
        )
    if not 0 < pl.master_port < 65536:
        raise ConfigError(f"placement.master_port = {pl.master_port}: give a port in 1..65535")
    if pl.nnodes > 1 and not pl.master_addr:
        raise ConfigError(
            f"placement.nnodes = {pl.nnodes} needs placement.master_addr, the address of "
            "training node 0 that every node can reach (e.g. its hostname)"
        )
    if pl.master_addr in ("127.0.0.1", "localhost") and pl.engine_nodes:
        raise ConfigError(
            f"placement.master_addr = {pl.master_addr!r} with engine_nodes = {pl.engine_nodes}: "
            "engines on other nodes cannot reach a loopback address; give training node 0's hostname"
        )
    if pl.engine_nodes and eng.kind != "sglang":
        raise ConfigError(
            "placement.engine_nodes runs SGLang servers on their own nodes: set engine.kind = 'sglang'"
        )
    if pl.engines_per_node < 1:
        raise ConfigError(f"placement.engines_per_node = {pl.engines_per_node}: must be >= 1")
    loopback = ("127.0.0.1", "localhost", "::1")
    remote = pl.engine_nodes > 0 or any(_host(u) not in loopback for u in eng.external)
    mode = push_mode
    if remote and mode in ("disk", "lora") and not pl.weight_dir:
        raise ConfigError(
            "engines on other nodes load pushed weights from disk: set placement.weight_dir to a "
            "directory they all mount (or use weight_push = 'distributed' over NCCL)"
        )
    if remote and mode == "distributed" and not pl.master_addr:
        raise ConfigError(
            "engines on other nodes join the NCCL weight push at placement.master_addr: set it "
            "to this (training node 0's) address"
        )
    if remote and mode == "tensor":
        raise ConfigError(
            "placement.weight_push = 'tensor' (CUDA IPC) cannot reach engines on other nodes; "
            "use 'distributed' or 'disk'"
        )
    if hsdp:
        ranks = len(pl.trainer_gpus) or pl.cpu_ranks
        if ranks < 1:
            raise ConfigError("trainer.hsdp needs at least one rank per node")
    if eng.router and eng.count < 1 and not eng.external and not eng.gpus and not pl.engine_nodes:
        raise ConfigError("engine.router = true but there are no engines to route to")


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or ""


def torchrun_rdzv(pl: PlacementConfig, run_name: str = "spade") -> list[str]:
    """torchrun's rendezvous arguments: ``--standalone`` on one node, else the c10d (or
    static) rendezvous at master_addr:master_port."""
    if pl.nnodes == 1:
        return ["--standalone"]
    endpoint = f"{pl.master_addr}:{pl.master_port}"
    out = [
        f"--nnodes={pl.nnodes}",
        f"--node-rank={pl.node_rank}",
        f"--rdzv-backend={pl.rdzv_backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={pl.rdzv_id or run_name}",
    ]
    if pl.rdzv_backend == "static":
        out += [f"--master-addr={pl.master_addr}", f"--master-port={pl.master_port}"]
    return out


def hsdp_mesh(device: torch.device):
    """A (nodes, ranks per node) device mesh: FSDP2 replicates over dim 0, shards over dim 1."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % per_node:
        raise RuntimeError(f"world size {world} is not a multiple of {per_node} ranks per node")
    return init_device_mesh(
        device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard")
    )
