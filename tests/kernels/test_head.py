"""One-pass policy head (kernels/head.py) against float64 references and the unfused path.

Shape legend: T tokens, D hidden, V vocabulary.

References: (a) float64 inputs through ``linear_logprob_ref`` (full logits) and
``policy_loss`` (the unfused loss), differentiated by autograd; (b) the same unfused path
in float32 (``linear_logprob`` + ``policy_loss``). Tolerances follow from the arithmetic
(tests/numerics.py): the log-probs carry ``logit_bound`` (the logits' rounding plus the
fp32 sums over V, D, T); the loss multiplies them into exp(lp - old), exp(ref - lp) and
exp(old - rollout), which turn an absolute log-prob error d into a relative error
d * (1 + |argument|), then a few rounded pointwise ops and one sum over T.
"""

from __future__ import annotations

import pytest
import spade_kernels as K
import torch
from numerics import EPS32, assert_close_norm, logit_bound, pointwise_bound
from spade_kernels.head import PolicyTerms, chunk_rows
from spade_kernels.reference import linear_logprob_ref

T, V, D = 47, 123, 31
OPS = 12  # rounded pointwise ops per token in the loss and its gradient (head.py docstring)

OPTIONS = {
    "detached": {},
    "old": dict(old=True),
    "tis": dict(old=True, tis=True),
    "tis_detached": dict(tis=True),
    "k3": dict(old=True, kl=0.1),
    "entropy": dict(entropy=0.05),
    "all": dict(old=True, tis=True, kl=0.1, entropy=0.05),
}


def _data(dtype=torch.float32, seed=0, t=T, v=V, d=D):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(t, d, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    y = torch.randint(0, v, (t,), generator=g)
    lp64 = linear_logprob_ref(h.detach().double(), w.detach().double(), y)
    old = lp64.float() + 0.3 * torch.randn(t, generator=g)  # ratios in ~[0.4, 2.5]: clips
    roll = old + 0.4 * torch.randn(t, generator=g)  # TIS weights, some capped at 2
    ref = lp64.float() + 0.3 * torch.randn(t, generator=g)
    adv = torch.randn(t, generator=g)
    mask = (torch.rand(t, generator=g) > 0.25).float()
    seq = torch.arange(t) // 6  # sequences of 6 tokens
    return h, w, y, dict(old=old, roll=roll, ref=ref, adv=adv, mask=mask, seq=seq)


def _terms(x, opt, agg, dtype=torch.float32, denom=None):
    cast = {k: (v.to(dtype) if v.dtype.is_floating_point else v) for k, v in x.items()}
    weight = K.loss_weights(cast["mask"], agg, seq_ids_T=x["seq"], loss_scale_denominator=denom)
    return PolicyTerms(
        weight,
        cast["adv"],
        old_logprob_T=cast["old"] if opt.get("old") else None,
        rollout_logprob_T=cast["roll"] if opt.get("tis") else None,
        ref_logprob_T=cast["ref"] if opt.get("kl") else None,
        kl_coef=opt.get("kl", 0.0),
        entropy_coef=opt.get("entropy", 0.0),
    )


def _unfused(h, w, y, x, opt, agg, temperature, logprob_fn, dtype):
    """policy_loss over separately computed log-probs: the path the fused head replaces."""
    cast = {k: (v.to(dtype) if v.dtype.is_floating_point else v) for k, v in x.items()}
    ent_on = bool(opt.get("entropy"))
    out = logprob_fn(h, w, y, temperature=temperature, return_entropy=ent_on)
    lp, ent = out if ent_on else (out, None)
    loss, _ = K.policy_loss(
        lp,
        cast["old"] if opt.get("old") else lp.detach(),
        cast["adv"],
        cast["mask"],
        agg=agg,
        rollout_logprob_T=cast["roll"] if opt.get("tis") else None,
        ref_logprob_T=cast["ref"] if opt.get("kl") else None,
        kl_coef=opt.get("kl", 0.0),
        entropy_T=ent,
        entropy_coef=opt.get("entropy", 0.0),
        seq_ids_T=x["seq"],
    )
    return loss, lp


def _bound(h, w, y, x, temperature, eps=EPS32):
    h64, w64 = h.detach().double(), w.detach().double()
    zmax = (h64 @ w64.T / temperature).abs().max().item()
    lp = linear_logprob_ref(h64, w64, y, temperature=temperature)
    expmax = max(
        (lp - x["old"]).abs().max().item(),
        (x["ref"] - lp).abs().max().item(),
        (x["old"] - x["roll"]).abs().max().item(),
    )
    (t, d), v = h.shape, w.shape[0]
    lp_rel = logit_bound(eps, zmax, v, d, t)
    return lp_rel * (1 + expmax) + pointwise_bound(OPS, expmax, t)


def _ref64(h, w, y, x, opt, agg, temperature):
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    x64 = {k: (v.double() if v.dtype.is_floating_point else v) for k, v in x.items()}
    ref_fn = linear_logprob_ref
    loss, lp = _unfused(h64, w64, y, x64, opt, agg, temperature, ref_fn, torch.float64)
    return loss, lp, torch.autograd.grad(loss, (h64, w64))


@pytest.mark.parametrize("agg", K.AGGREGATIONS)
@pytest.mark.parametrize("option", list(OPTIONS))
def test_fused_head_matches_float64_and_unfused(option, agg):
    opt, temperature = OPTIONS[option], 0.8
    h, w, y, x = _data()
    out = K.policy_head(
        h, w, y, _terms(x, opt, agg), temperature=temperature, chunk_bytes=10 * V * 8
    )  # 10-row chunks: 5 chunks, the last one partial
    grads = torch.autograd.grad(out.loss, (h, w))
    ref_loss, ref_lp, ref_grads = _ref64(h, w, y, x, opt, agg, temperature)
    rel = _bound(h, w, y, x, temperature)
    # the loss is a weighted sum: its error is relative to the sum of |weighted terms|
    terms_abs = _terms(x, opt, agg, torch.float64).token_weight_T.abs().sum().item()
    scale = max(abs(ref_loss.item()), terms_abs)
    assert abs(out.loss.item() - ref_loss.item()) <= rel * scale * 10, (out.loss, ref_loss)
    assert_close_norm(out.logprob_T, ref_lp.detach(), rel, "log-probs")
    for a, b, name in zip(grads, ref_grads, ("grad_h", "grad_w"), strict=True):
        assert a.dtype == torch.float32 and b.abs().sum() > 0
        assert_close_norm(a, b, rel, f"{name} vs float64")
    # the same gradients as autograd through the unfused float32 path
    h2, w2 = (t.detach().requires_grad_() for t in (h, w))
    loss32, _ = _unfused(h2, w2, y, x, opt, agg, temperature, K.linear_logprob, torch.float32)
    for a, b in zip(grads, torch.autograd.grad(loss32, (h2, w2)), strict=True):
        assert_close_norm(a, b.double(), 2 * rel, "vs unfused float32")
    if opt.get("entropy"):
        assert out.entropy_T is not None and not out.entropy_T.requires_grad


@pytest.mark.parametrize("agg", K.AGGREGATIONS)
def test_float64_head_is_exact_and_matches_finite_differences(agg):
    opt = OPTIONS["all"]
    h, w, y, x = _data(torch.float64, seed=3, t=13, v=29, d=7)
    terms = _terms(x, opt, agg, torch.float64)
    out = K.policy_head(h, w, y, terms, temperature=0.7, chunk_bytes=4 * 29 * 24)
    ref_loss, _, ref_grads = _ref64(h, w, y, x, opt, agg, 0.7)
    assert abs(out.loss.item() - ref_loss.item()) <= 1e-12 * max(1.0, abs(ref_loss.item()))
    for a, b in zip(torch.autograd.grad(out.loss, (h, w)), ref_grads, strict=True):
        assert_close_norm(a, b, 1e-12, "float64 gradient")

    # central differences along random directions (independent of any autograd formula)
    g_h, g_w = torch.autograd.grad(K.policy_head(h, w, y, terms, temperature=0.7).loss, (h, w))
    gen = torch.Generator().manual_seed(11)
    step = 1e-6
    with torch.no_grad():
        for _ in range(3):
            dh, dw = (
                torch.randn(h.shape, generator=gen, dtype=h.dtype),
                torch.randn(w.shape, generator=gen, dtype=w.dtype),
            )
            f = [
                K.policy_head(h + s * dh, w + s * dw, y, terms, temperature=0.7).loss.item()
                for s in (step, -step)
            ]
            fd = (f[0] - f[1]) / (2 * step)
            analytic = (g_h * dh).sum().item() + (g_w * dw).sum().item()
            assert abs(fd - analytic) <= 1e-6 * max(1.0, abs(analytic)), (fd, analytic)
    out = K.policy_head(h, w, y, terms)
    out.loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        out.loss.backward()


def test_bfloat16_inputs_within_their_rounding():
    opt, agg = OPTIONS["all"], "token"
    h, w, y, x = _data(torch.bfloat16, seed=4)
    out = K.policy_head(h, w, y, _terms(x, opt, agg), temperature=0.8, chunk_bytes=20 * V * 8)
    grads = torch.autograd.grad(out.loss, (h, w))
    _, _, ref_grads = _ref64(h, w, y, x, opt, agg, 0.8)
    # the gradient over logits is rounded to bf16 before both GEMMs: one more eps_bf16
    eps = torch.finfo(torch.bfloat16).eps
    rel = _bound(h, w, y, x, 0.8, eps) + eps
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == torch.bfloat16
        assert_close_norm(a, b, rel, "bf16 gradient")


def test_token_shards_sum_to_the_whole():
    """Per-token inputs shard along T (sequence parallelism): the shards' losses and
    gradients add up to the one-call result, weights computed once for the whole batch."""
    opt, agg = OPTIONS["all"], "seq-mean-token-mean"
    h, w, y, x = _data(seed=5)
    terms = _terms(x, opt, agg)
    whole = K.policy_head(h, w, y, terms)
    g_whole = torch.autograd.grad(whole.loss, (h, w))
    cut = 20
    parts = [
        K.policy_head(h[sl], w, y[sl], terms.index(sl)) for sl in (slice(0, cut), slice(cut, T))
    ]
    total = parts[0].loss + parts[1].loss
    g_parts = torch.autograd.grad(total, (h, w))
    rel = _bound(h, w, y, x, 1.0)
    assert abs(total.item() - whole.loss.item()) <= rel * terms.token_weight_T.sum().item()
    for a, b in zip(g_parts, g_whole, strict=True):
        assert_close_norm(a, b.double(), rel, "sharded gradient")


def test_backward_scales_stored_gradients_and_masked_garbage_is_ignored():
    h, w, y, x = _data(seed=6)
    x["mask"][:5] = 0
    x["old"][:5] = float("inf")  # garbage where nothing is trained
    x["ref"][:5] = float("nan")
    terms = _terms(x, OPTIONS["all"], "token")
    out = K.policy_head(h, w, y, terms)
    (g_h,) = torch.autograd.grad(3.0 * out.loss, (h,))
    assert torch.isfinite(out.loss) and torch.isfinite(g_h).all()
    assert g_h[:5].abs().max() == 0
    x2 = {k: v.clone() for k, v in x.items()}
    x2["old"][:5], x2["ref"][:5] = 0.0, 0.0
    again = K.policy_head(h, w, y, _terms(x2, OPTIONS["all"], "token"))
    (g_h2,) = torch.autograd.grad(again.loss, (h,))
    assert torch.equal(out.loss, again.loss)
    assert_close_norm(g_h, 3.0 * g_h2.double(), 4 * EPS32, "scaled gradient")


def test_no_grad_forward_and_detached_weight():
    h, w, y, x = _data(seed=7)
    terms = _terms(x, OPTIONS["old"], "token")
    with torch.no_grad():
        out = K.policy_head(h, w, y, terms)
    assert out.loss.grad_fn is None
    ref = K.policy_head(h, w, y, terms)
    assert torch.equal(out.loss, ref.loss.detach())
    only_h = K.policy_head(h, w.detach(), y, terms)
    (g_h,) = torch.autograd.grad(only_h.loss, (h,))
    (g_ref,) = torch.autograd.grad(ref.loss, (h,))
    assert torch.equal(g_h, g_ref)


def test_three_products_per_chunk():
    h, w, y, x = _data(seed=8)
    terms = _terms(x, OPTIONS["all"], "token")
    rows = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = K.policy_head(h, w, y, terms, chunk_bytes=rows * V * 8)
        out.loss.backward()
    calls = {e.key: e.count for e in prof.key_averages()}
    chunks = -(-T // rows)
    assert calls.get("aten::mm", 0) + calls.get("aten::addmm_", 0) == 3 * chunks, calls


def test_chunks_follow_the_memory_budget():
    assert chunk_rows(49_152, 4, 64 << 20) == 320  # 341 rows fit, rounded down to 64s
    assert chunk_rows(151_936, 2, 256 << 20) == 832
    assert chunk_rows(1000, 4, 10 * 4000) == 10  # fewer than 64: not rounded
    assert chunk_rows(10**9, 4, 1) == 1


def test_bad_arguments():
    h, w, y, x = _data()
    terms = _terms(x, {}, "token")
    with pytest.raises(ValueError, match="kl_coef"):
        K.policy_head(h, w, y, PolicyTerms(terms.token_weight_T, terms.advantage_T, kl_coef=0.1))
    with pytest.raises(ValueError, match="advantage_T shape"):
        K.policy_head(h, w, y, PolicyTerms(terms.token_weight_T, terms.advantage_T[:-1]))
    with pytest.raises(ValueError, match="temperature"):
        K.policy_head(h, w, y, terms, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        K.policy_head(h, w, y, terms, chunk_bytes=0)
    with pytest.raises(ValueError, match="dtype"):
        K.policy_head(h, w.double(), y, terms)
    with pytest.raises(ValueError, match="agg="):
        K.loss_weights(x["mask"], "mean")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_head_on_cuda_matches_float64(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    opt, agg = OPTIONS["all"], "seq-mean-token-mean"
    h, w, y, x = _data(dtype, seed=9, t=300, v=5000, d=128)
    cuda = {k: v.cuda() for k, v in x.items()}
    hc, wc = (t.detach().cuda().requires_grad_() for t in (h, w))
    out = K.policy_head(hc, wc, y.cuda(), _terms(cuda, opt, agg), temperature=0.8)
    grads = torch.autograd.grad(out.loss, (hc, wc))
    _, _, ref = _ref64(h, w, y, x, opt, agg, 0.8)
    eps = torch.finfo(dtype).eps
    rel = _bound(h, w, y, x, 0.8, eps) + (eps if dtype == torch.bfloat16 else 0)
    for a, b in zip(grads, ref, strict=True):
        assert_close_norm(a.cpu(), b, rel, f"{dtype} CUDA gradient")
