"""Scale knobs that cannot work: one line at start and in ``--dry-run`` (exit 2).

- ``trainer.lora``: a model family or target module peft cannot adapt here (the trainer's
  families are Llama/Qwen; Qwen3-MoE's experts are fused 3-D parameters, not nn.Linear);
- ``trainer.sequence_parallel``: N must divide the attention heads and the KV heads (the
  Ulysses all-to-all splits both) and the trainer ranks;
- ``trainer.offload``: "optimizer" needs trainer GPUs (CPU ranks already keep every state
  in host memory), FSDP2's CPUOffloadPolicy in this torch, and a trainer process-group
  backend that moves CPU tensors (``offload_problem``).

``check_start`` adds what the trainer does not run (sequence parallel with a per-sample
token mean through the recompute head; offload where torch has no CUDA): refused at start,
said by the dry run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spade_async.errors import ConfigError
from spade_async.plan.shapes import FAMILIES, model_shape

if TYPE_CHECKING:
    from spade_async.recipe import Config

__all__ = ["check_scale", "check_start", "offload_problem"]


def _model_dir(cfg: Config) -> Path:
    from spade_async.models import EMBEDDED, cache_root

    if cfg.model in EMBEDDED:
        return cache_root() / "models" / cfg.model
    return Path(cfg.model).expanduser()


def moves_cpu_tensors(backend: str) -> bool:
    """Whether a process group of ``backend`` ("nccl", "gloo", "cpu:gloo,cuda:nccl") runs
    collectives on CPU tensors: torch's ``Backend.backend_capability`` for a bare name,
    the ``cpu:`` entry of a device map (distributed_c10d.py, ``BackendConfig``)."""
    import torch.distributed as dist

    b = backend.lower().replace(" ", "")
    if ":" in b:
        return any(item.split(":", 1)[0] == "cpu" for item in b.split(","))
    return "cpu" in dist.Backend.backend_capability.get(b, [])


def offload_problem(offload: str, cuda: bool, backend: str) -> str | None:
    """Why ``trainer.offload`` cannot run on trainer ranks with(out) ``cuda`` whose process
    group is ``backend``, or None. With "optimizer" the sharded weights, gradients and
    AdamW states live on the host: FSDP2's state-dict broadcast at start-up and the
    gradient norm's all-reduce run on CPU tensors, which NCCL alone cannot move."""
    if offload != "optimizer":
        return None
    if not cuda:
        return (
            'trainer.offload = "optimizer" needs CUDA on the trainer ranks and this torch has '
            "none (torch.cuda.is_available() is False): run on a GPU node, or set "
            'trainer.offload = "none"'
        )
    if not moves_cpu_tensors(backend):
        return (
            f'trainer.offload = "optimizer" keeps the shards on the host, but the trainer\'s '
            f"process-group backend {backend!r} cannot move CPU tensors: use "
            "'cpu:gloo,cuda:nccl' (trainer/main.py backend())"
        )
    return None


def check_scale(cfg: Config, model_dir: str | Path | None = None) -> None:
    tc, pl = cfg.trainer, cfg.placement
    shape = model_shape(model_dir or _model_dir(cfg))
    ranks = (len(pl.trainer_gpus) or pl.cpu_ranks) * max(1, pl.nnodes)
    if tc.offload == "optimizer":
        if not pl.trainer_gpus:
            raise ConfigError(
                'trainer.offload = "optimizer" needs trainer GPUs (placement.trainer_gpus): CPU '
                'ranks already keep weights and optimizer states in host memory; set trainer.offload = "none"'
            )
        try:
            from torch.distributed.fsdp import CPUOffloadPolicy  # noqa: F401
        except ImportError:
            raise ConfigError(
                'trainer.offload = "optimizer" needs FSDP2\'s CPUOffloadPolicy, which this torch '
                'lacks: upgrade torch (>= 2.6) or set trainer.offload = "none"'
            ) from None
        from spade_async.trainer.main import backend  # what the GPU trainer ranks will start

        why = offload_problem(tc.offload, True, backend(True, tc.offload))
        if why:
            raise ConfigError(why)
    lora = tc.lora
    if lora is not None:
        if lora.rank < 1 or lora.alpha <= 0 or not 0 <= lora.dropout < 1:
            raise ConfigError(
                f"trainer.lora = rank {lora.rank}, alpha {lora.alpha}, dropout {lora.dropout}: "
                "need rank >= 1, alpha > 0 and 0 <= dropout < 1"
            )
        if not lora.target_modules:
            raise ConfigError(
                "trainer.lora.target_modules is empty: name e.g. ['q_proj', 'v_proj']"
            )
        if shape is not None:
            if shape.model_type not in FAMILIES:
                raise ConfigError(
                    f"trainer.lora: model family '{shape.model_type}' is not one the trainer "
                    f"adapts ({', '.join(FAMILIES)}): remove trainer.lora"
                )
            linear = shape.linear_shapes()
            bad = [m for m in lora.target_modules if m not in linear]
            if bad:
                why = (
                    " (Qwen3-MoE experts are fused 3-D parameters, not nn.Linear)"
                    if shape.experts and set(bad) & {"gate_proj", "up_proj", "down_proj"}
                    else ""
                )
                raise ConfigError(
                    f"trainer.lora.target_modules has {', '.join(map(repr, bad))}, which "
                    f"{shape.name} ({shape.model_type}) has no nn.Linear of{why}: use some of "
                    f"{', '.join(linear)}"
                )
    if tc.routing_replay:
        from spade_async.generation.routed_experts import route_shape_of

        if route_shape_of(model_dir or _model_dir(cfg)) is None:
            raise ConfigError(
                f"trainer.routing_replay = {tc.routing_replay!r}: {cfg.model} is a dense model (no "
                "MoE router to replay); set trainer.routing_replay = false"
            )
    n = tc.sequence_parallel
    if n < 1:
        raise ConfigError(f"trainer.sequence_parallel = {n}: must be >= 1")
    if n > 1:
        if ranks % n:
            raise ConfigError(
                f"trainer.sequence_parallel = {n} does not divide the {ranks} trainer ranks: "
                f"pick a divisor of {ranks}"
            )
        if shape is not None and (shape.heads % n or shape.kv_heads % n):
            fits = [k for k in (2, 4, 8, 16) if shape.heads % k == 0 and shape.kv_heads % k == 0]
            raise ConfigError(
                f"trainer.sequence_parallel = {n} does not divide {shape.name}'s {shape.heads} "
                f"attention heads ({shape.kv_heads} KV heads), which the all-to-all splits: "
                f"use {' or '.join(map(str, fits))}"
            )


def check_start(cfg: Config) -> None:
    """At start only: the knobs the dry run plans but the trainer does not run yet."""
    import importlib.util

    if cfg.trainer.offload == "optimizer" and cfg.placement.trainer_gpus:
        import torch

        from spade_async.trainer.main import backend

        cuda = torch.cuda.is_available()
        why = offload_problem(cfg.trainer.offload, cuda, backend(cuda, cfg.trainer.offload))
        if why:
            raise ConfigError(why)

    if cfg.trainer.lora is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError(
            "trainer.lora needs the 'peft' package (a project dependency): pip install peft"
        )
    if (
        cfg.trainer.sequence_parallel > 1
        and cfg.trainer.loss_agg == "seq-mean-token-mean"
        and cfg.trainer.head != "fused"
    ):
        raise ConfigError(
            "trainer.sequence_parallel > 1 with trainer.loss_agg = 'seq-mean-token-mean' needs "
            "trainer.head = 'fused' (its per-token weights come from the whole row; the "
            "recompute head aggregates within a slice): set trainer.head = 'fused'"
        )
