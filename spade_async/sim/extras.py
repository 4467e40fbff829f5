"""What a real step costs beyond the loop's own path, each figure with its source.

- checkpoint: DCP shards (bf16 weights, fp32 master, two fp32 Adam moments: 14 bytes a
  parameter with the HF export's 2) written at ``CKPT_WRITE_GB_S``, every
  ``checkpoint_every`` steps; the simulated trainer sleeps it (``parts.SimTrainer.save``), so
  it lands on the wall where the schedule cannot hide it (sync: always);
- evaluation: ``spade eval`` runs on a checkpoint, outside the training loop (the loop
  schedules no evaluation pass, ``loop/cycle.py``): zero in a step, stated, not assumed;
- optimizer offload (``trainer.offload = "optimizer"``, FSDP2 ``CPUOffloadPolicy``): each
  step moves the rank's fp32 shard host -> GPU for forward and backward and its gradients
  back (``PCIE_GB_S``), and runs Adam on the host (``ADAM_PARAMS_S_PER_CORE`` measured here
  x ``HOST_CORES_PER_GPU``);
- route decoding (MoE with ``trainer.routing_replay``): the controller base64-decodes and
  checks ``layers x top-k`` int32 per token (``generation/routed_experts.decode_sglang``);
  its CPU per row is measured here (``route_decode_s_per_row``) and added to the
  controller's CPU per step for the rows the step decoded.
"""

from __future__ import annotations

import time

__all__ = ["CKPT_WRITE_GB_S", "PCIE_GB_S", "ADAM_PARAMS_S_PER_CORE", "HOST_CORES_PER_GPU",
           "SOURCES", "checkpoint_s", "offload_s", "route_decode_s_per_row"]  # fmt: skip

CKPT_WRITE_GB_S = 2.0
PCIE_GB_S = 25.0
ADAM_PARAMS_S_PER_CORE = 21.7e6
HOST_CORES_PER_GPU = 12
CKPT_BYTES_PER_PARAM = 14  # bf16 HF export 2 + fp32 master 4 + Adam m, v 8

SOURCES = {
    "checkpoint": f"assumed: {CKPT_WRITE_GB_S} GB/s to node-local NVMe, all ranks together; "
    f"{CKPT_BYTES_PER_PARAM} bytes a parameter (configs/qwen3-8b-games.toml: ~110 GB at 8B)",
    "evaluation": "none in the loop: spade eval runs on checkpoints apart from training",
    "offload": f"PCIe {PCIE_GB_S} GB/s a GPU (assumed, H100 PCIe Gen5 x16 at ~40% of 64); "
    f"host Adam {ADAM_PARAMS_S_PER_CORE / 1e6:.1f}M params/s a core (measured on this "
    f"machine: torch.optim.Adam foreach, 20M fp32 params, 1 thread, load ~6) x "
    f"{HOST_CORES_PER_GPU} cores a GPU (assumed: a 2 x 48-core host for 8 GPUs)",
    "route_decoding": "measured on this machine: decode_sglang per row (route_decode_s_per_row)",
}


def checkpoint_s(params: float, write_gb_s: float = CKPT_WRITE_GB_S) -> float:
    return params * CKPT_BYTES_PER_PARAM / (write_gb_s * 1e9)


def offload_s(params: float, ranks: int) -> float:
    """Seconds one train step adds with the optimizer (and master weights) on the host."""
    shard = params / max(1, ranks)
    moved = shard * 4 * 2 + shard * 4  # fp32 params in for forward and backward, grads out
    return moved / (PCIE_GB_S * 1e9) + shard / (ADAM_PARAMS_S_PER_CORE * HOST_CORES_PER_GPU)


def route_decode_s_per_row(layers: int, topk: int, experts: int, rows: int = 4096) -> float:
    """CPU seconds to decode one token's routes (``decode_sglang``), measured here."""
    import numpy as np

    from spade_async.generation.routed_experts import RouteShape, decode_sglang, encode_sglang

    ids = np.random.default_rng(0).integers(0, experts, size=(rows, layers, topk))
    text = encode_sglang(ids)
    shape = RouteShape(layers=layers, topk=topk, experts=experts)
    decode_sglang(text, shape, rows)
    n, c0 = 5, time.process_time()
    for _ in range(n):
        decode_sglang(text, shape, rows)
    return (time.process_time() - c0) / (n * rows)
