"""Our three head paths against slime's loss (tests/slime_reference.py), in float64.

Shape legend: T tokens, D hidden, V vocabulary, S samples.

Paths: "reference" (linear_logprob_ref's full logits, then policy_loss through autograd),
"recompute" (the chunked linear_logprob, then policy_loss) and "fused" (the one-pass
policy_head, torch rows); the Triton row pass runs in tests/kernels/test_triton_interpret.py.
Every loss_agg, KL on and off, TIS on and off, and the three PPO "old" policies: loss and
gradients (hidden state and LM-head weight) equal slime's within 1e-12 relative. In float64
both sides round at ~1e-16 per operation; the longest chain is a sum over V = 123 logits
and T = 47 tokens, and the largest exp argument is 20 (|ref - logprob|, where the clamp
cuts the value and the gradient), so the rounding stays below ~1e-13.
"""

from __future__ import annotations

import math

import pytest
import slime_reference as slime
import spade_kernels as K
import torch
from numerics import assert_close_norm
from spade_kernels.head import PolicyTerms, token_terms
from spade_kernels.reference import linear_logprob_ref

V, D, TEMP, REL = 123, 31, 0.8, 1e-12
LENGTHS = [5, 7, 6, 9, 8, 6, 6]  # S = 7 samples, T = 47 tokens
GROUPS = [0, 0, 0, 1, 2, 3, 4]  # samples 0-2: one episode's three turn samples
ZERO_MASK = 5  # sample 5 trains nothing (compact-filtered): slime still counts it
ADVANTAGES = [1.0, 1.0, 1.0, -0.7, 0.4, 0.0, -1.3]  # an episode's turns share its advantage
# ref - logprob on both sides of the clamp's edges (k3 = 10 at 2.6109 and -10.99998)
EDGES = [2.60, 2.62, -10.99, -11.01, 20.0, -20.0]


def _data():
    g = torch.Generator().manual_seed(33)
    T = sum(LENGTHS)
    h = torch.randn(T, D, generator=g, dtype=torch.float64)
    w = 0.3 * torch.randn(V, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (T,), generator=g)
    seq = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    mask = (torch.rand(T, generator=g) > 0.2).double()
    mask[torch.tensor(LENGTHS).cumsum(0) - torch.tensor(LENGTHS)] = 0.0  # first tokens
    mask[seq == ZERO_MASK] = 0.0
    lp, _ = slime.head_logprobs(h, w, y, TEMP)
    d = torch.linspace(-20.0, 20.0, T, dtype=torch.float64)
    d[: len(EDGES)] = torch.tensor(EDGES, dtype=torch.float64)
    old = lp + 0.3 * torch.randn(T, generator=g, dtype=torch.float64)
    x = dict(
        mask=mask,
        seq=seq,
        adv=torch.tensor(ADVANTAGES, dtype=torch.float64)[seq],
        ref=lp + d,
        old=old,
        roll=old + 0.4 * torch.randn(T, generator=g, dtype=torch.float64),
    )
    return h, w, y, x


def _units(x):
    """Per token, its unit's (group's) loss tokens; the unit count; slime's token count."""
    group_T = torch.tensor(GROUPS)[x["seq"]]
    n_G = torch.zeros(len(set(GROUPS)), dtype=torch.float64).index_add_(0, group_T, x["mask"])
    n_S = torch.zeros(len(LENGTHS), dtype=torch.float64).index_add_(0, x["seq"], x["mask"])
    return n_G[group_T], len(set(GROUPS)), float(n_S.clamp(min=1).sum())


OLD = ("current", "given", "rollout")  # detached own log-probs, a given policy, the rollout's
CASES = [
    (agg, kl, tis, old)
    for agg in K.AGGREGATIONS
    for kl in (False, True)
    for tis in (False, True)
    for old in OLD
]


def _opts(kl, tis, old):
    return dict(kl_coef=0.5 if kl else 0.0, entropy_coef=0.03 if kl else 0.0, tis=tis, old=old)


def _ours(path, h, w, y, x, agg, o):
    n_T, units, tokens = _units(x)
    denom = tokens if agg == "token" else float(units)
    seq_tokens = None if agg == "token" else n_T
    old_T = {"current": None, "given": x["old"], "rollout": x["roll"]}[o["old"]]
    roll_T = x["roll"] if o["tis"] else None
    ref_T = x["ref"] if o["kl_coef"] else None
    if path == "fused":
        weights = K.loss_weights(
            x["mask"], agg, loss_scale_denominator=denom, seq_tokens_T=seq_tokens
        )
        terms = PolicyTerms(
            weights,
            x["adv"],
            old_logprob_T=old_T,
            rollout_logprob_T=roll_T,
            ref_logprob_T=ref_T,
            kl_coef=o["kl_coef"],
            entropy_coef=o["entropy_coef"],
            tis_current=o["old"] == "rollout",
        )
        head = K.policy_head(h, w, y, terms, temperature=TEMP, chunk_bytes=10 * V * 16)
        return head.loss  # 10-row chunks: 5 chunks, the last one partial
    if path == "reference":
        lp, ent = linear_logprob_ref(h, w, y, temperature=TEMP, return_entropy=True)
    else:
        lp, ent = K.linear_logprob(
            h, w, y, temperature=TEMP, return_entropy=True, chunk_size=7, backend="torch"
        )
    loss, _ = K.policy_loss(
        lp,
        lp.detach() if old_T is None else old_T,
        x["adv"],
        x["mask"],
        agg=agg,
        rollout_logprob_T=roll_T,
        ref_logprob_T=ref_T,
        kl_coef=o["kl_coef"],
        entropy_T=ent,
        entropy_coef=o["entropy_coef"],
        seq_ids_T=x["seq"],
        loss_scale_denominator=denom,
        seq_tokens_T=seq_tokens,
        tis_current=o["old"] == "rollout",
    )
    return loss


def _slime(h, w, y, x, agg, o):
    lp, ent = slime.head_logprobs(h, w, y, TEMP)

    def split(t):
        return list(t.split(LENGTHS))

    mode = {"token": "per_token", "seq-mean-token-mean": "sample_mean"}.get(agg, "seq_sum")
    return slime.slime_loss(
        split(lp),
        split(x["mask"]),
        split(x["adv"]),
        groups=GROUPS,
        mode=mode,
        old_log_probs=split(x["old"]) if o["old"] == "given" else None,
        rollout_log_probs=split(x["roll"]),
        use_rollout_logprobs=o["old"] == "rollout",
        use_tis=o["tis"],
        ref_log_probs=split(x["ref"]),
        kl_loss_coef=o["kl_coef"],
        entropy=split(ent),
        entropy_coef=o["entropy_coef"],
    )


def _grads(fn, h, w):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(h, w)
    return (loss.detach(), *torch.autograd.grad(loss, (h, w)))


@pytest.mark.parametrize("agg, kl, tis, old", CASES)
def test_every_head_path_equals_slime_in_float64(agg, kl, tis, old):
    h, w, y, x = _data()
    o = _opts(kl, tis, old)
    want = _grads(lambda h, w: _slime(h, w, y, x, agg, o), h, w)
    assert want[0] != 0 and want[1].norm() > 0
    for path in ("reference", "recompute", "fused"):
        got = _grads(lambda h, w, p=path: _ours(p, h, w, y, x, agg, o), h, w)
        assert abs(got[0].item() - want[0].item()) <= REL * abs(want[0].item()), path
        assert_close_norm(got[1], want[1], REL, f"{path}: gradient w.r.t. the hidden state")
        assert_close_norm(got[2], want[2], REL, f"{path}: gradient w.r.t. the LM-head weight")


# Hand-worked low_var_kl tokens, d = ref - logprob: k3 = e^d - d - 1, clamped to [-10, 10];
# d k3 / d logprob = 1 - e^d inside the clamp, 0 outside (torch.clamp's gradient).
HAND = [
    # d,      kl value,                      d kl / d logprob
    (2.60, math.exp(2.60) - 3.60, 1 - math.exp(2.60)),  # 9.8637 inside; -12.4637
    (2.62, 10.0, 0.0),  # k3 = 10.1157: cut
    (-10.99, math.exp(-10.99) + 9.99, 1 - math.exp(-10.99)),  # 9.99002 inside; 0.99998
    (-11.01, 10.0, 0.0),  # k3 = 10.0100: cut
    (20.0, 10.0, 0.0),  # k3 = 4.85e8: cut (unclamped gradient -4.85e8)
    (-20.0, 10.0, 0.0),  # k3 = 19.0: cut
    (0.5, math.exp(0.5) - 1.5, 1 - math.exp(0.5)),  # 0.14872 inside
]


def test_low_var_kl_is_clamped_by_hand_in_policy_loss_and_the_head_rows():
    beta = 0.5
    d = torch.tensor([r[0] for r in HAND], dtype=torch.float64)
    kl_want = torch.tensor([r[1] for r in HAND], dtype=torch.float64)
    g_want = beta * torch.tensor([r[2] for r in HAND], dtype=torch.float64)
    lp = torch.full((len(HAND),), -3.0, dtype=torch.float64, requires_grad=True)
    zero, ones = torch.zeros_like(d), torch.ones_like(d)
    # slime's own formula on these tokens (the table is what it gives)
    kl_slime = slime.low_var_kl(lp, lp.detach() + d)
    torch.testing.assert_close(kl_slime.detach(), kl_want, rtol=1e-15, atol=0)
    # policy_loss: loss = beta * sum kl (token agg, denominator 1, advantages 0)
    loss, m = K.policy_loss(
        lp, lp.detach(), zero, ones, ref_logprob_T=lp.detach() + d, kl_coef=beta,
        loss_scale_denominator=1.0,
    )  # fmt: skip
    (g,) = torch.autograd.grad(loss, lp)
    assert loss.item() == pytest.approx(beta * kl_want.sum().item(), rel=1e-15)
    torch.testing.assert_close(g, g_want, rtol=1e-15, atol=0)
    assert m["kl"].item() == pytest.approx(kl_want.mean().item(), rel=1e-15)
    # the one-pass head's closed form (kernels/head.py token_terms, the torch row pass)
    terms = PolicyTerms(ones, zero, ref_logprob_T=lp.detach() + d, kl_coef=beta)
    loss_C, g_lp, _ = token_terms(lp.detach(), None, terms)
    torch.testing.assert_close(loss_C, beta * kl_want, rtol=1e-15, atol=0)
    torch.testing.assert_close(g_lp, g_want, rtol=1e-15, atol=0)


def test_tis_in_rollout_mode_weighs_the_trainer_against_the_rollout():
    """old_logprobs = "rollout" (slime's --use-rollout-logprobs --use-tis): the ratio is
    exp(lp - rollout) and the weight clamp(exp(lp - rollout), 0, cap), lp detached; before,
    the weight was exp(rollout - rollout) = 1."""
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    roll = torch.tensor([-1.1, -4.0, -0.45], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    ones = torch.ones(3, dtype=torch.float64)
    loss, m = K.policy_loss(
        lp, roll, adv, ones, rollout_logprob_T=roll, tis_cap=2.0, tis_current=True,
        loss_scale_denominator=1.0,
    )  # fmt: skip
    # by hand: ratios e^0.1 = 1.10517 (inside [0.8, 1.28]), e^2 = 7.389 (A > 0: clipped to
    # 1.28, no gradient), e^-0.05 = 0.95123; weights min(ratio, 2): 1.10517, 2, 0.95123
    r = [math.exp(0.1), math.exp(2.0), math.exp(-0.05)]
    tau = [r[0], 2.0, r[2]]
    want = -tau[0] * r[0] - tau[1] * 1.28 + tau[2] * r[2]
    assert loss.item() == pytest.approx(want, rel=1e-15)
    (g,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(
        g, torch.tensor([-tau[0] * r[0], 0.0, tau[2] * r[2]], dtype=torch.float64),
        rtol=1e-15, atol=0,
    )  # fmt: skip
    assert m["tis_mean"].item() == pytest.approx(sum(tau) / 3, rel=1e-15)
