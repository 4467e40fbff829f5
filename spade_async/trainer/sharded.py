"""Sharded start-up: no rank ever holds the whole fp32 model, on a GPU or in host memory.

1. Every rank builds the model on the meta device (shapes only) and applies FSDP2
   (``fully_shard`` per decoder block, then the root), so each parameter is a DTensor whose
   local shard is all this rank will ever allocate.
2. ``to_empty`` allocates just those shards (fp32) on the rank's device; under optimizer
   offload (FSDP2 ``CPUOffloadPolicy``) on the host instead, buffers still on the device
   (``placement``: FSDP2's lazy init refuses offloaded shards that are not on the CPU).
3. Rank 0 reads the checkpoint with transformers (in the checkpoint's own dtype, on CPU:
   its key conversions, e.g. the fused MoE experts of Qwen3-MoE, stay transformers'
   business) and ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``
   (torch DCP) broadcasts one tensor at a time; each rank keeps its slice.
4. Buffers (rotary ``inv_freq``, not in the state dict) are broadcast from rank 0 too.

Peak per GPU: the fp32 shard (4 B/param / ranks) plus one full tensor in the checkpoint
dtype in flight. Host memory: rank 0 holds the checkpoint once in its dtype (bf16 for
Qwen3: 2 B/param), the other ranks nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["load_sharded", "placement"]


def placement(device: torch.device, offload: bool) -> tuple[torch.device, torch.device]:
    """(parameters, buffers): where ``to_empty`` materialises the FSDP2 shards and where the
    buffers (rotary ``inv_freq``) go.

    Under ``CPUOffloadPolicy`` FSDP2's lazy init (``_fsdp_param_group.py``,
    ``FSDPParamGroup._validate_cpu_offload_params``, at the first forward) raises unless
    every sharded parameter is on the CPU: the DTensor keeps the device it was built on, so
    re-pinning its local tensor later does not help. FSDP2 moves the shards to the device
    itself for each all-gather; buffers are not FSDP-managed and are read by the forward on
    the device, so they stay there (as ``fully_shard``'s ``_move_states_to_device`` leaves
    them, and torchtitan's ``buffer_device``). Without offload both live on ``device``."""
    return (torch.device("cpu"), device) if offload else (device, device)


def load_sharded(
    model_dir: str | Path,
    device: torch.device,
    *,
    attn_implementation: str,
    wrap: Callable[[nn.Module], nn.Module],
    adapt: Callable[[nn.Module], nn.Module] | None = None,
    offload: bool = False,
    experts: dict | None = None,
) -> nn.Module:
    """The FSDP2-sharded, fully loaded module that ``wrap(causal_lm)`` returns (``wrap``
    makes the PolicyModel and applies fully_shard; it runs on the meta model). ``adapt``
    (LoRA injection) runs on rank 0's checkpoint copy first, so its state dict carries the
    adapters ``wrap`` also adds to the meta model. ``offload``: ``wrap`` applied FSDP2's
    CPUOffloadPolicy (see ``placement``); the process group must then move CPU tensors
    (gloo, or ``cpu:gloo,cuda:nccl``): the state dict is broadcast from the host shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    experts = experts or {}  # model.experts_kwargs: how MoE experts load
    rank0 = dist.get_rank() == 0
    source = None
    if rank0:  # the checkpoint once, on CPU, in its own dtype
        source = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype="auto", attn_implementation=attn_implementation, **experts
        )
        if adapt is not None:
            source = adapt(source)
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        causal_lm = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=attn_implementation, **experts
        )
    policy = wrap(causal_lm)
    param_device, buffer_device = placement(device, offload)
    policy.to_empty(device=param_device)
    prefix = _prefix(policy, causal_lm)
    full = {prefix + k: v for k, v in source.state_dict().items()} if rank0 else {}
    set_model_state_dict(
        policy,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del full
    src_buffers = dict(source.named_buffers()) if rank0 else {}
    _buffers_to(policy, buffer_device)
    for name, buf in causal_lm.named_buffers():
        if rank0:
            buf.copy_(src_buffers[name].to(buf.dtype))
        dist.broadcast(buf, src=0)
    _check_loaded(policy)
    return policy


def _buffers_to(module: nn.Module, device: torch.device) -> None:
    """Every buffer onto ``device`` in place of the old one (after the state dict load: a
    persistent buffer on another device than the shards would make DCP's broadcast refuse
    the mix, "Multiple devices found")."""
    for m in module.modules():
        for name, buf in m._buffers.items():
            if buf is not None and buf.device != device:
                m._buffers[name] = buf.to(device)


def _prefix(policy: nn.Module, inner: nn.Module) -> str:
    for name, module in policy.named_modules():
        if module is inner:
            return f"{name}." if name else ""
    raise ValueError("wrap() must return a module that contains the causal LM")


def _check_loaded(policy: nn.Module) -> None:
    """Every parameter was written (a meta leftover or NaN garbage would train silently)."""
    for name, p in policy.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.is_meta or (local.numel() and not torch.isfinite(local).all()):
            raise RuntimeError(f"parameter {name} was not loaded from the checkpoint")
