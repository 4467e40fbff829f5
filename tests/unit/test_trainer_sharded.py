"""Sharded start-up (sharded.py): meta init + FSDP2, shards filled from rank 0's checkpoint.

One gloo rank in-process here; the two-rank path runs in tests/integration/test_trainer_rpc.py,
whose loss and gradient norm match a float64 single-process reference."""

from __future__ import annotations

import torch
import torch.distributed as dist

from spade_async.trainer.config import TrainerConfig


def test_sharded_load_equals_the_checkpoint(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from spade_async.trainer import sharded
    from spade_async.trainer.model import load_policy

    loads = []
    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained",
        lambda *a, **kw: loads.append(kw.get("dtype")) or real(*a, **kw))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        policy = load_policy(TrainerConfig(model=str(tiny_model)), tiny_model,
                             torch.device("cpu"), shard=True)
    finally:
        dist.destroy_process_group()
    assert loads == ["auto"]  # rank 0 read the checkpoint once, in its own dtype
    want = real(str(tiny_model), dtype=torch.float32)
    ref = dict(want.named_parameters())
    got = dict(policy.causal_lm.named_parameters())
    assert got.keys() == ref.keys()
    for name, p in got.items():
        assert hasattr(p, "full_tensor") and p.dtype == torch.float32  # an FSDP2 shard, fp32
        assert torch.equal(p.full_tensor(), ref[name].detach()), name
    for name, b in want.named_buffers():  # rotary inv_freq: not in the state dict
        assert torch.equal(dict(policy.causal_lm.named_buffers())[name], b), name
    assert policy.causal_lm.lm_head.weight is policy.causal_lm.model.embed_tokens.weight
    assert sharded._prefix(policy, policy.causal_lm) == "causal_lm."


def _fsdp2_validates(device: torch.device) -> None:
    """FSDP2's own check at its lazy init (the first forward), on one fake parameter whose
    shard lives on ``device``: CPU-runnable, since the rule reads only ``device.type``."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    param = SimpleNamespace(sharded_param=SimpleNamespace(device=device), _param_fqn="w")
    group = SimpleNamespace(offload_policy=CPUOffloadPolicy(), fsdp_params=[param])
    FSDPParamGroup._validate_cpu_offload_params(group)


def test_offload_on_cuda_materialises_shards_on_the_host_and_buffers_on_the_gpu():
    """Issue 34: with CPUOffloadPolicy the shards were materialised on the GPU
    (``to_empty(device=cuda)``), which FSDP2 refuses at step 1 on a GPU; CPU ranks cannot
    see it (everything is on the CPU there). The decision, for a CUDA rank, against
    FSDP2's own validation."""
    import pytest

    from spade_async.trainer.sharded import placement

    cuda = torch.device("cuda", 3)
    params, buffers = placement(cuda, offload=True)
    assert (params, buffers) == (torch.device("cpu"), cuda)
    _fsdp2_validates(params)  # accepted
    with pytest.raises(RuntimeError, match="materialized on CPU"):
        _fsdp2_validates(cuda)  # the old placement: FSDP2 raises this at the first forward
    assert placement(cuda, offload=False) == (cuda, cuda)
    assert placement(torch.device("cpu"), offload=True) == (torch.device("cpu"),) * 2


def test_offload_load_goes_through_the_placement_and_trains(tiny_model, tmp_path, monkeypatch):
    """load_policy passes trainer.offload to the sharded load, which materialises where
    ``placement`` says; one offloaded step runs on a gloo rank, shards on the host."""
    from trainer_batches import random_batch

    from spade_async.trainer import sharded
    from spade_async.trainer.step import Trainer

    calls, real = [], sharded.placement
    monkeypatch.setattr(sharded, "placement", lambda d, o: calls.append((d, o)) or real(d, o))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        cfg = TrainerConfig(model=str(tiny_model), offload="optimizer", lr=1e-3)
        trainer = Trainer(cfg, tiny_model, torch.device("cpu"))
        m = trainer.train_step(random_batch(0))
    finally:
        dist.destroy_process_group()
    assert calls == [(torch.device("cpu"), True)]
    assert m["skipped"] == 0.0 and trainer.version == 1
    for name, p in trainer.model.named_parameters():
        assert p.to_local().device.type == "cpu", name
    # a CUDA rank builds AdamW(fused=True) (step.py: fused on CUDA) over these host shards:
    # torch's fused kernels list "cpu" (utils/_foreach_utils.py) and DTensor shards
    # aten._fused_adamw_ (distributed/tensor/_ops/_pointwise_ops.py); step it here
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    before = params[0].to_local().clone()
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    opt.step()
    assert not torch.equal(params[0].to_local(), before)
    assert opt.state[params[0]]["exp_avg"].to_local().device.type == "cpu"
