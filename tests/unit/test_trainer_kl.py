"""KL against a frozen reference model (the reference's low_var_kl vs its --ref-load)."""

from __future__ import annotations

import math

import torch

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig


def _batch() -> Batch:
    return Batch(
        samples=[
            Sample(
                token_ids=[1, 2, 3, 4, 5],
                loss_mask=[0, 0, 1, 1, 1],
                advantage=a,
                rollout_logprobs=[0.0, 0.0, -1.0, -2.0, -0.5],
            )
            for a in (1.0, -1.0)
        ]
    )


def _k3(ref_T: torch.Tensor, logprob_T: torch.Tensor) -> float:
    d = (ref_T - logprob_T).double()
    return float((d.exp() - d - 1).mean())


def test_kl_to_the_frozen_initial_policy(tiny_model):
    from spade_async.trainer.step import Trainer

    cfg = TrainerConfig(model=str(tiny_model), lr=5e-2, kl_coef=0.1, grad_clip=0.0)
    trainer = Trainer(cfg, tiny_model)
    assert trainer.ref_model is not None
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    ref_before = [p.detach().clone() for p in trainer.ref_model.parameters()]
    m1 = trainer.train_step(_batch())
    # step 1: the policy is the initial policy, so the KL to it is exactly 0 (the rollout
    # log-probs above are made up and far from the model's: 'rollout' would not be 0)
    assert m1["kl"] == 0.0
    m2 = trainer.train_step(_batch())
    assert m2["kl"] > 0.0 and math.isfinite(m2["kl"])
    # the reference never moves, and its log-probs are the initial model's
    assert all(
        torch.equal(a, b) for a, b in zip(trainer.ref_model.parameters(), ref_before, strict=True)
    )
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    pos = torch.arange(5).unsqueeze(0)
    tgt = torch.tensor([2, 3, 4, 5, 0])
    with torch.no_grad():
        ref_T = trainer.ref_model(ids, pos, tgt)[2:4]
        now_T = trainer.model(ids, pos, tgt)[2:4]
    assert _k3(ref_T, now_T) > 0.0  # the policy moved away from its frozen reference


def test_kl_to_rollout_logprobs_needs_no_reference_copy(tiny_model):
    from spade_async.trainer.step import Trainer

    cfg = TrainerConfig(model=str(tiny_model), lr=1e-3, kl_coef=0.1, kl_reference="rollout")
    trainer = Trainer(cfg, tiny_model)
    assert trainer.ref_model is None
    assert trainer.train_step(_batch())["kl"] > 0.0  # the made-up rollout log-probs differ
    assert Trainer(TrainerConfig(model=str(tiny_model)), tiny_model).ref_model is None  # kl 0
