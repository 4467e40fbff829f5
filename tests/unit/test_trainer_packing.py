"""Packing keeps attention and loss inside each sample; the loss is split-invariant."""

from __future__ import annotations

import random

import pytest
import torch

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.packing import build_microbatch, plan_microbatches


def _samples(n: int, seed: int = 0, vocab: int = 49152) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.choice([3, 5, 9, 17, 40])
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        out.append(
            Sample(
                token_ids=[rng.randrange(vocab) for _ in range(length)],
                loss_mask=mask,
                advantage=rng.uniform(-1, 1),
                rollout_logprobs=[-rng.uniform(5, 15) if m else 0.0 for m in mask],
            )
        )
    return out


def test_plan_balances_ranks_and_respects_budget():
    lengths = [100, 7, 300, 50, 50, 900, 12, 33, 250, 5]
    plan = plan_microbatches(lengths, 2, 400)
    assert len(plan[0]) == len(plan[1])
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    assert seen == list(range(len(lengths)))
    for rank in plan:
        for mb in rank:
            assert len(mb) == 1 or sum(lengths[i] for i in mb) <= 400
    loads = [sum(lengths[i] for mb in rank for i in mb) for rank in plan]
    assert abs(loads[0] - loads[1]) <= 100


def test_plan_pads_short_rank_with_empty_microbatch():
    plan = plan_microbatches([10], 2, 100)
    assert plan == [[[0]], [[]]]


def _run(policy, mb, **kw):
    return policy(
        mb.input_ids,
        mb.position_ids,
        mb.target_T,
        mb.attention_mask,
        cu_seqlens=mb.cu_seqlens,
        max_seqlen=mb.max_seqlen,
        **kw,
    )


@pytest.mark.parametrize("attn", ["auto", "sdpa", "eager"])
def test_packed_logprobs_equal_unpacked(tiny_model, attn):
    """Per-sequence varlen SDPA (default on CPU) and transformers' block-diagonal masks."""
    from spade_async.trainer.model import load_policy

    cfg = TrainerConfig(model=str(tiny_model), attn_implementation=attn)
    policy = load_policy(cfg, tiny_model, torch.device("cpu"), shard=False)
    policy.eval()
    samples = _samples(5)
    # two fp32 evaluations of the same log-probs differ by at most twice the log-sum-exp
    # rounding over the vocabulary, relative to |log-prob| (numerics.py), on any CPU
    from numerics import reduction_bound

    tol = dict(rtol=2 * reduction_bound(49152), atol=2 * reduction_bound(49152))
    with torch.no_grad():
        mb = build_microbatch(samples, list(range(5)), packed=True)
        assert mb.input_ids.shape[0] == 1 and mb.position_ids[0, 0] == 0
        packed_T = _run(policy, mb)
        only_loss_T = _run(policy, mb, index_K=mb.loss_index_K)
        torch.testing.assert_close(only_loss_T, packed_T * mb.mask_T, **tol)
        padded = build_microbatch(samples, list(range(5)), packed=False)
        padded_T = _run(policy, padded)
        for i in range(len(samples)):
            one = build_microbatch(samples, [i], packed=True)
            alone_T = _run(policy, one)
            sel = (mb.seq_T == i) & (mb.mask_T > 0)
            torch.testing.assert_close(packed_T[sel], alone_T[one.mask_T > 0], **tol)
            sel_pad = (padded.seq_T == i) & (padded.mask_T > 0)
            torch.testing.assert_close(padded_T[sel_pad], alone_T[one.mask_T > 0], **tol)
        # and the packed row really differs from attending across samples
        flat_pos = torch.arange(mb.input_ids.shape[1]).unsqueeze(0)
        leaky_T = policy(mb.input_ids, flat_pos, mb.target_T)
    assert not torch.allclose(leaky_T[mb.mask_T > 0], packed_T[mb.mask_T > 0], atol=1e-4)


@pytest.mark.parametrize("agg", ["token", "seq-mean-token-mean"])
def test_one_vs_four_microbatches_same_gradients(tiny_model, agg):
    """Every layout and split gives the float64 one-micro-batch gradient to fp32 rounding."""
    from numerics import assert_close_norm, reduction_bound

    from spade_async.trainer.step import Trainer

    samples = _samples(8, seed=1)
    batch = Batch(samples=samples)

    def grad(budget: int, layout: str, double: bool = False) -> torch.Tensor:
        cfg = TrainerConfig(
            model=str(tiny_model), micro_batch_tokens=budget, loss_agg=agg, old_logprobs="rollout"
        )
        trainer = Trainer(cfg, tiny_model)
        if double:
            trainer.model.double()
        _, _, n_micro = trainer.accumulate(batch, layout)
        assert n_micro == (1 if budget > 1000 else 4 if layout == "packed" else 8)
        return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])

    ref64 = grad(100_000, "packed", double=True)
    assert ref64.dtype == torch.float64 and ref64.abs().sum() > 0
    vocab = 49152
    loss_tokens = sum(sum(s.loss_mask) for s in samples)
    rel = reduction_bound(vocab, loss_tokens)  # log-sum-exp over V, then the sum over tokens
    # the bound is tight enough to see a 0.1% error (a wrong denominator, a lost token)
    assert rel < 1e-3
    for budget, layout in [(100_000, "packed"), (40, "packed"), (40, "padded"), (40, "padded_max")]:
        assert_close_norm(grad(budget, layout), ref64, rel, f"{layout} budget={budget}")


def test_padded_max_pads_every_row_to_the_batch_longest():
    samples = _samples(6, seed=2)
    longest = max(len(s.token_ids) for s in samples)
    mb = build_microbatch(samples, [0, 1], packed=False, pad_to=longest)
    assert mb.input_ids.shape == (2, longest)
    assert mb.n_tokens == len(samples[0].token_ids) + len(samples[1].token_ids)
    assert int((mb.seq_T >= 0).sum()) == mb.n_tokens


def test_unknown_layout_is_rejected(tiny_model):
    from spade_async.trainer.step import Trainer

    trainer = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    with pytest.raises(ValueError, match="padded_max"):
        trainer.accumulate(Batch(samples=_samples(2)), "diagonal")


def test_sorted_buckets_fill_the_budget_shortest_first():
    lengths = [30, 5, 12, 6, 11, 40, 7]
    (plan,) = plan_microbatches(lengths, 1, 40, packed=False, sorted_buckets=True)
    assert plan == [[1, 3, 6], [4, 2], [0], [5]]  # adding 4 there: 4 x 11 > 40
    assert all(len(mb) * max(lengths[i] for i in mb) <= 40 for mb in plan)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))


def test_sorted_buckets_give_the_one_microbatch_gradient(tiny_model):
    from spade_async.trainer.step import Trainer

    batch = Batch(samples=_samples(8, seed=1))
    grads = []
    for budget, layout in [(100_000, "packed"), (40, "padded_sorted")]:
        cfg = TrainerConfig(model=str(tiny_model), micro_batch_tokens=budget)
        trainer = Trainer(cfg, tiny_model)
        _, _, n_micro = trainer.accumulate(batch, layout)
        lengths = [len(s.token_ids) for s in batch.samples]
        (plan,) = plan_microbatches(lengths, 1, 40, packed=False, sorted_buckets=True)
        assert len(plan) > 1 and n_micro == (1 if layout == "packed" else len(plan))
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()]))
    # same sum in another order: fp32 roundoff (eps 1.2e-7) over < 100 accumulated terms
    err = (grads[1] - grads[0]).norm() / grads[0].norm()
    assert 0 < grads[0].norm() and err < 100 * torch.finfo(torch.float32).eps
