"""Qwen3-MoE experts through one grouped GEMM: the trainer loads MoE checkpoints with
transformers' ``grouped_mm`` experts implementation, and on a tiny random Qwen3-MoE it
gives the looped ("eager": one matmul per expert in Python) log-probs and gradients.

Tolerance: numerics.forward_bound for the log-probs (same weights, other summation order),
twice that for the gradients (the same sums once more in backward).
"""

from __future__ import annotations

import torch
from numerics import assert_close_norm, forward_bound

from spade_async.trainer.config import TrainerConfig


def _write_tiny_moe(path):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=64,
        decoder_sparse_step=1,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return config


def _lp_grads(causal_lm, ids):
    causal_lm.zero_grad(set_to_none=True)
    out = causal_lm(ids)
    lp = torch.log_softmax(out.logits[0, :-1], -1).gather(1, ids[0, 1:, None])
    lp.sum().backward()
    return lp.detach(), torch.cat([p.grad.reshape(-1) for p in causal_lm.parameters()])


def test_trainer_loads_moe_with_grouped_experts_equal_to_looped(tmp_path):
    from transformers import AutoModelForCausalLM

    from spade_async.trainer.model import experts_kwargs, load_policy

    config = _write_tiny_moe(tmp_path)
    assert experts_kwargs(tmp_path) == {"experts_implementation": "grouped_mm"}
    policy = load_policy(
        TrainerConfig(model=str(tmp_path)), tmp_path, torch.device("cpu"), shard=False
    )
    grouped = policy.causal_lm
    assert grouped.config._experts_implementation == "grouped_mm"
    looped = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32, experts_implementation="eager"
    )
    assert looped.config._experts_implementation == "eager"
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    lp_g, g_g = _lp_grads(grouped, ids)
    lp_l, g_l = _lp_grads(looped, ids)
    bound = forward_bound(config, ids.shape[1])
    assert_close_norm(lp_g, lp_l.double(), bound, "log-probs")
    assert_close_norm(g_g, g_l.double(), 2 * bound, "gradients")
    experts = [n for n, _ in grouped.named_parameters() if "experts" in n]
    assert experts and g_l.abs().sum() > 0


def test_dense_models_get_no_experts_kwarg(tiny_model):
    from spade_async.trainer.model import experts_kwargs

    assert experts_kwargs(tiny_model) == {}
