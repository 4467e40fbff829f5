"""``placement`` settings: which GPUs (and nodes) run engines and trainer ranks, and how
weights travel between them. A leaf: the checks and launch plans live in
``spade_async/placement.py`` and ``launch/layout.py``."""

from __future__ import annotations

from typing import Literal

import msgspec

from spade_async.config import Doc

__all__ = ["PlacementConfig"]


class PlacementConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    trainer_gpus: Doc(
        list[int], "GPU ids of the FSDP trainer ranks, one rank each; [] = CPU ranks on gloo"
    ) = []
    cpu_ranks: Doc(int, "trainer ranks when trainer_gpus is empty (CPU, gloo)") = 1
    trainer_threads: Doc(int, "torch threads per trainer rank; 0 = torch's default") = 0
    trainer_cpus: Doc(list[int], "CPU cores the trainer ranks are pinned to; [] = no pinning") = []
    controller_cpus: Doc(
        list[int],
        "CPU cores the controller (and the env workers it starts) is pinned to; [] = no "
        "pinning. On a CPU-only machine, the CPU engine's cores keep the trainer's to itself",
    ) = []
    colocate: Doc(
        bool, "engines and trainer may share GPUs and take turns; false = disjoint GPU sets"
    ) = False
    release_memory: Doc(
        bool,
        "colocated: engines release weights and KV cache around each train step "
        "(SGLang needs --enable-memory-saver in engine.extra_args)",
    ) = True
    weight_push: Doc(
        Literal["auto", "disk", "distributed", "tensor"],
        "how new weights reach the engines: disk (safetensors + /update_weights_from_disk), "
        "distributed (NCCL broadcast from trainer rank 0, disaggregated SGLang), tensor (CUDA "
        "IPC, colocated SGLang); auto picks disk for CPU engines or CPU trainer ranks, else "
        "tensor when colocated, else distributed",
    ) = "auto"
    # ---- several nodes (spade_async/launch/nodes.py) ----
    nnodes: Doc(
        int, "training nodes; each runs placement.trainer_gpus ranks (torchrun --nnodes)"
    ) = 1
    node_rank: Doc(int, "this node's rank among the training nodes (0 runs the controller)") = 0
    master_addr: Doc(
        str, "training node 0's address: torchrun rendezvous and NCCL weight push ('' = local)"
    ) = ""
    master_port: Doc(int, "torchrun rendezvous port on master_addr") = 29500
    rdzv_backend: Doc(
        Literal["c10d", "static"],
        "torchrun rendezvous across nodes; c10d ranks nodes by address, static by node_rank",
    ) = "c10d"
    rdzv_id: Doc(str, "rendezvous id shared by every node of one job ('' = the run name)") = ""
    engine_nodes: Doc(int, "nodes that only run SGLang engines (spade slurm puts them first)") = 0
    engines_per_node: Doc(int, "SGLang servers per engine node (spade slurm)") = 8
    gpus_per_node: Doc(
        int, "GPUs per node (spade slurm); engine TP = gpus_per_node / engines_per_node"
    ) = 8
    engine_port: Doc(int, "first SGLang server port on an engine node (spade slurm)") = 30000
    weight_dir: Doc(
        str, "disk weight push: a directory every engine can read ('' = /dev/shm, one node)"
    ) = ""
