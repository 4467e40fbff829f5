"""Scale knobs that cannot work: one line at start and in ``--dry-run`` (exit 2).

- ``trainer.lora``: a model family or target module peft cannot adapt here (the trainer's
  families are Llama/Qwen; Qwen3-MoE's experts are fused 3-D parameters, not nn.Linear);
- ``trainer.sequence_parallel``: N must divide the attention heads and the KV heads (the
  Ulysses all-to-all splits both) and the trainer ranks;
- ``trainer.offload``: "optimizer" needs trainer GPUs (CPU ranks already keep every state
  in host memory), and FSDP2's CPUOffloadPolicy in this torch.

``check_start`` adds what the trainer does not run (sequence parallel with a per-sample
token mean through the recompute head): refused at start, planned by the dry run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spade_async.errors import ConfigError
from spade_async.plan.shapes import FAMILIES, model_shape

if TYPE_CHECKING:
    from spade_async.recipe import Config

__all__ = ["check_scale", "check_start"]


def _model_dir(cfg: Config) -> Path:
    from spade_async.models import EMBEDDED, cache_root

    if cfg.model in EMBEDDED:
        return cache_root() / "models" / cfg.model
    return Path(cfg.model).expanduser()


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
