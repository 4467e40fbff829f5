"""policy_loss against values worked by hand.

Shape legend: T tokens. Ratios are chosen directly: old_logprob = 0, logprob = log(ratio).

Tolerances follow from the float32 arithmetic (tests/numerics.py): a hand value is exact, the
kernel's is a few rounded pointwise ops (exp of a log-ratio |x| <= LOGMAX, clip, products,
TIS/KL terms: at most OPS of them) per token and one sum over the tokens, so its absolute
error is at most ``REL * sum|terms|``; the micro-batch test compares against the same loss
computed in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from numerics import EPS32, approx32, assert_close_norm, pointwise_bound
from spade_kernels import policy_loss

OPS, LOGMAX = 8, 2.0  # pointwise ops per token; the hand-picked |log ratio| are below log 3
REL = pointwise_bound(OPS, LOGMAX, 4)  # at most 4 tokens per hand-worked test


def _lp(ratios):
    return torch.tensor([math.log(r) for r in ratios], requires_grad=True)


def test_token_agg_asymmetric_clip_by_hand():
    # t0: r=1.5, A=+1 -> clipped at 1.28: pg=-1.28 (no grad)
    # t1: r=0.5, A=-1 -> clipped at 0.8: pg=+0.8 (no grad)
    # t2: r=1.1, A=+2 -> inside: pg=-2.2, d pg/d logprob = -A*r = -2.2
    # t3: masked out.   loss = (-1.28 + 0.8 - 2.2) / 3
    logprob_T = _lp([1.5, 0.5, 1.1, 1.0])
    zeros = torch.zeros(4)
    adv_T = torch.tensor([1.0, -1.0, 2.0, -1.0])
    mask_T = torch.tensor([1, 1, 1, 0])
    loss, m = policy_loss(logprob_T, zeros, adv_T, mask_T)
    assert loss.item() == approx32(-2.68 / 3, (1.28 + 0.8 + 2.2) / 3, REL)
    loss.backward()
    assert_close_norm(
        logprob_T.grad, torch.tensor([0.0, 0.0, -2.2 / 3, 0.0], dtype=torch.float64), REL, "grad"
    )
    assert m["clip_frac"].item() == approx32(2 / 3, 1, REL)
    assert m["clip_high_frac"].item() == approx32(1 / 3, 1, REL)
    assert m["clip_low_frac"].item() == approx32(1 / 3, 1, REL)
    assert m["tokens"].item() == 3
    assert m["ratio_mean"].item() == approx32((1.5 + 0.5 + 1.1) / 3, 3.1 / 3, REL)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in m.values())


def test_clip_is_asymmetric():
    # r=1.25 with A=+1 is inside [0.8, 1.28]; r=0.75 with A=-1 is clipped to 0.8.
    logprob_T = _lp([1.25, 0.75])
    loss, m = policy_loss(
        logprob_T, torch.zeros(2), torch.tensor([1.0, -1.0]), torch.ones(2), agg="token"
    )
    assert loss.item() == approx32((-1.25 + 0.8) / 2, (1.25 + 0.8) / 2, REL)
    assert m["clip_frac"].item() == approx32(0.5, 1, REL)
    # Symmetric 0.2 clips the first one too: (-1.2 + 0.8) / 2.
    sym, _ = policy_loss(
        logprob_T, torch.zeros(2), torch.tensor([1.0, -1.0]), torch.ones(2), clip_high=0.2
    )
    assert sym.item() == approx32((-1.2 + 0.8) / 2, (1.2 + 0.8) / 2, REL)


def test_tis_weight_is_capped_and_detached():
    # old - rollout = log 3 -> w = min(3, 2) = 2;  log 0.5 -> w = 0.5. Ratios 1 (no clip).
    logprob_T = _lp([1.0, 1.0])
    old_T = torch.zeros(2)
    rollout_T = torch.tensor([-math.log(3.0), math.log(2.0)], requires_grad=True)
    adv_T = torch.tensor([1.0, 1.0])
    loss, m = policy_loss(logprob_T, old_T, adv_T, torch.ones(2), rollout_logprob_T=rollout_T)
    assert loss.item() == approx32((-2.0 - 0.5) / 2, 2.5 / 2, REL)
    assert m["tis_mean"].item() == approx32(1.25, 1.25, REL)
    assert m["tis_capped_frac"].item() == approx32(0.5, 1, REL)
    loss.backward()
    assert_close_norm(logprob_T.grad, torch.tensor([-1.0, -0.25], dtype=torch.float64), REL, "grad")
    assert rollout_T.grad is None


def test_k3_kl_and_entropy_bonus_by_hand():
    # logprob = 0 = old, A = 0 -> pg = 0. ref - logprob = log 2 -> k3 = 2 - log 2 - 1.
    logprob_T = torch.zeros(1, requires_grad=True)
    ref_T = torch.tensor([math.log(2.0)])
    entropy_T = torch.tensor([1.5], requires_grad=True)
    k3 = 1.0 - math.log(2.0)
    loss, m = policy_loss(
        logprob_T,
        torch.zeros(1),
        torch.zeros(1),
        torch.ones(1),
        ref_logprob_T=ref_T,
        kl_coef=0.1,
        entropy_T=entropy_T,
        entropy_coef=0.01,
    )
    assert loss.item() == approx32(0.1 * k3 - 0.01 * 1.5, 0.1 * k3 + 0.015, REL)
    assert m["kl"].item() == approx32(k3, 2 + math.log(2.0) + 1, REL)
    assert m["entropy"].item() == approx32(1.5, 1.5, REL)
    loss.backward()
    # d k3 / d logprob = 1 - exp(ref - logprob) = 1 - 2 = -1 ; entropy grad = -coef.
    assert logprob_T.grad.item() == approx32(-0.1, 0.1 * (1 + 2), REL)
    assert entropy_T.grad.item() == approx32(-0.01, 0.01, REL)


def test_sequence_aggregations_by_hand():
    # All ratios 1, A = per-token value -> per-token loss = -A.
    # seq 0: tokens A=[1, 3] (both masked in), seq 1: A=[2, 9] with the 9 masked out.
    adv_T = torch.tensor([1.0, 3.0, 2.0, 9.0])
    mask_T = torch.tensor([1.0, 1.0, 1.0, 0.0])
    lp = torch.zeros(4, requires_grad=True)
    cu = torch.tensor([0, 2, 4])
    mean, m = policy_loss(
        lp, torch.zeros(4), adv_T, mask_T, agg="seq-mean-token-mean", cu_seqlens=cu
    )
    assert mean.item() == approx32((-(1 + 3) / 2 - 2) / 2, 4, REL)
    assert m["sequences"].item() == 2
    total, _ = policy_loss(
        lp,
        torch.zeros(4),
        adv_T,
        mask_T,
        agg="seq-mean-token-sum",
        seq_ids_T=torch.tensor([0, 0, 1, 1]),
    )
    assert total.item() == approx32((-4 - 2) / 2, 6, REL)
    rows, _ = policy_loss(
        lp.reshape(2, 2),
        torch.zeros(2, 2),
        adv_T.reshape(2, 2),
        mask_T.reshape(2, 2),
        agg="seq-mean-token-mean",
    )
    assert rows.item() == approx32(mean.item(), 4, REL)


@pytest.mark.parametrize("agg", ["token", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_split_gives_same_loss_and_grads(agg):
    g = torch.Generator().manual_seed(0)
    lengths = [5, 3, 7, 4, 6, 2]
    T = sum(lengths)
    seq_T = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    logprob_T = (-torch.rand(T, generator=g)).requires_grad_()
    old_T = logprob_T.detach() + 0.3 * torch.randn(T, generator=g)
    rollout_T = old_T + 0.2 * torch.randn(T, generator=g)
    adv_T = torch.randn(T, generator=g)
    mask_T = (torch.rand(T, generator=g) > 0.3).float()
    kw = dict(agg=agg, rollout_logprob_T=rollout_T, ref_logprob_T=old_T, kl_coef=0.05)

    full, _ = policy_loss(logprob_T, old_T, adv_T, mask_T, seq_ids_T=seq_T, **kw)
    (g_full,) = torch.autograd.grad(full, (logprob_T,))

    # the same loss in float64 on the same (float32) inputs: the reference for both
    f64 = {k: v.double() for k, v in dict(old=old_T, adv=adv_T, mask=mask_T).items()}
    lp64 = logprob_T.detach().double().requires_grad_()
    kw64 = {**kw, "rollout_logprob_T": rollout_T.double(), "ref_logprob_T": old_T.double()}
    ref, _ = policy_loss(lp64, f64["old"], f64["adv"], f64["mask"], seq_ids_T=seq_T, **kw64)
    (g_ref,) = torch.autograd.grad(ref, (lp64,))
    # per-token |terms|: each token's loss alone (token agg, denominator 1); every weight the
    # aggregations give a token is <= 1, so their sum bounds what the float32 sums add up
    terms = [
        policy_loss(
            lp64[i : i + 1],
            f64["old"][i : i + 1],
            f64["adv"][i : i + 1],
            torch.ones(1, dtype=torch.float64),
            loss_scale_denominator=1.0,
            rollout_logprob_T=kw64["rollout_logprob_T"][i : i + 1],
            ref_logprob_T=kw64["ref_logprob_T"][i : i + 1],
            kl_coef=0.05,
        )[0]
        .abs()
        .item()
        for i in range(T)
        if mask_T[i]
    ]
    logmax = (logprob_T - rollout_T).abs().max().item() + (logprob_T - old_T).abs().max().item()
    rel = pointwise_bound(OPS, logmax, T)

    denom = mask_T.sum() if agg == "token" else float(len(lengths))
    cuts = [0, 8, 15, T]  # sequence boundaries: [5,3] [7] [4,6,2]
    total = 0.0
    for s, e in zip(cuts[:-1], cuts[1:], strict=True):
        part, _ = policy_loss(
            logprob_T[s:e],
            old_T[s:e],
            adv_T[s:e],
            mask_T[s:e],
            seq_ids_T=seq_T[s:e] - seq_T[s],
            loss_scale_denominator=denom,
            **{**kw, "rollout_logprob_T": rollout_T[s:e], "ref_logprob_T": old_T[s:e]},
        )
        total = total + part
    (g_split,) = torch.autograd.grad(total, (logprob_T,))
    assert full.item() == approx32(ref.item(), sum(terms), rel)
    assert total.item() == approx32(ref.item(), sum(terms), rel)
    assert_close_norm(g_full, g_ref, rel, "one-batch gradient")
    assert_close_norm(g_split, g_ref, rel, "micro-batch gradient")
    assert g_full.abs().sum() > 0 and EPS32 < rel < 1e-4


def test_bad_arguments():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="agg="):
        policy_loss(x, x, x, x, agg="mean")
    with pytest.raises(ValueError, match="advantage_T shape"):
        policy_loss(x, x, torch.zeros(2), x)
    with pytest.raises(ValueError, match="ref_logprob_T"):
        policy_loss(x, x, x, x, kl_coef=0.1)
    with pytest.raises(ValueError, match="seq_ids_T or cu_seqlens"):
        policy_loss(x, x, x, x, agg="seq-mean-token-mean")
