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
