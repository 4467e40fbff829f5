"""Chunked linear_logprob (torch row ops) against the plain-torch reference.

Shape legend: T tokens, D hidden, V vocabulary, B batch, L sequence length.
"""

from __future__ import annotations

import pytest
import spade_kernels as K
import torch
from numerics import EPS32, assert_close_norm, logit_bound
from spade_kernels.reference import linear_logprob_ref

T, V, D = 47, 123, 31


def _inputs(dtype, seed=0, t=T, v=V, d=D):
    g = torch.Generator().manual_seed(seed)
    hidden_TD = torch.randn(t, d, generator=g).to(dtype).requires_grad_()
    weight_VD = (0.3 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    target_T = torch.randint(0, v, (t,), generator=g)
    return hidden_TD, weight_VD, target_T


def _run(fn, hidden_TD, weight_VD, target_T, entropy, seed=1, **kw):
    """Outputs and grads of sum(g_lp * logprob + g_ent * entropy) for random upstream g."""
    out = fn(hidden_TD, weight_VD, target_T, return_entropy=entropy, **kw)
    outs = out if entropy else (out,)
    gen = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(o.shape, generator=gen) for o in outs]
    total = sum((o * u).sum() for o, u in zip(outs, upstream, strict=True))
    grads = torch.autograd.grad(total, (hidden_TD, weight_VD))
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("chunk", [1, 10, 47, 64])
def test_matches_reference(dtype, temperature, entropy, chunk):
    h, w, y = _inputs(dtype)
    outs, grads = _run(
        K.linear_logprob,
        h,
        w,
        y,
        entropy,
        temperature=temperature,
        chunk_size=chunk,
        backend="torch",
    )
    # float64 reference on the same (already rounded) inputs; the bound follows from the
    # compute dtype's rounding of the logits (numerics.logit_bound), on any CPU
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    ref_outs, ref_grads = _run(linear_logprob_ref, h64, w64, y, entropy, temperature=temperature)
    zmax = (h64 @ w64.T / temperature).abs().max().item()
    rel = logit_bound(torch.finfo(dtype).eps, zmax, V, D, T)
    for a, b in zip(outs, ref_outs, strict=True):
        assert a.dtype == torch.float32
        assert_close_norm(a, b, rel, "outputs")
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == dtype and a.shape == b.shape
        assert_close_norm(a, b, rel, "gradients")


def test_gradcheck_fp64_with_entropy_and_temperature():
    g = torch.Generator().manual_seed(3)
    h = (0.5 * torch.randn(9, 5, generator=g, dtype=torch.float64)).requires_grad_()
    w = torch.randn(13, 5, generator=g, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, 13, (9,), generator=g)

    def fn(h, w):
        return K.linear_logprob(h, w, y, temperature=0.6, return_entropy=True, chunk_size=4)

    assert torch.autograd.gradcheck(fn, (h, w))


def test_tied_embedding_weight_gets_both_gradients():
    emb_VD = (0.3 * torch.randn(V, D, generator=torch.Generator().manual_seed(4))).requires_grad_()
    ids_T = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(5))
    target_T = ids_T.roll(-1)
    emb64_VD = emb_VD.detach().double().requires_grad_()
    grads = []
    for fn, kw, emb in (
        (K.linear_logprob, dict(chunk_size=8), emb_VD),
        (linear_logprob_ref, {}, emb64_VD),  # float64 reference
    ):
        hidden_TD = torch.tanh(emb[ids_T] * 2.0)  # stand-in for the model body
        lp_T, ent_T = fn(hidden_TD, emb, target_T, return_entropy=True, **kw)
        (lp_T.sum() - 0.1 * ent_T.sum()).backward()
        grads.append(emb.grad.clone())
    zmax = (torch.tanh(emb64_VD[ids_T] * 2.0) @ emb64_VD.T).abs().max().item()
    assert_close_norm(grads[0], grads[1], logit_bound(EPS32, zmax, V, D, T), "tied gradient")
    assert grads[0][ids_T].abs().sum() > 0


def test_leading_dims_and_saved_state_is_small():
    h, w, y = _inputs(torch.float32, t=2 * 24)
    h_BLD = h.detach().reshape(2, 24, D).requires_grad_()
    lp_BL = K.linear_logprob(h_BLD, w, y.reshape(2, 24), chunk_size=5)
    assert lp_BL.shape == (2, 24)
    h64, w64 = h.detach().double(), w.detach().double()
    ref_T = linear_logprob_ref(h64, w64, y)
    zmax = (h64 @ w64.T).abs().max().item()
    assert_close_norm(lp_BL.detach().reshape(-1), ref_T, logit_bound(EPS32, zmax, V, D), "lp")
    # The graph keeps inputs plus O(T) vectors, never a T x V tensor.
    saved = lp_BL.grad_fn.next_functions[0][0].saved_tensors
    extra = sum(t.numel() for t in saved if t is not None) - h.numel() - w.numel() - y.numel()
    assert extra <= 2 * 48


def test_no_grad_inputs_and_detached_weight():
    h, w, y = _inputs(torch.float32)
    lp = K.linear_logprob(h, w.detach(), y, chunk_size=16)
    (g_h,) = torch.autograd.grad(lp.sum(), (h,))
    h64 = h.detach().double().requires_grad_()
    w64 = w.detach().double()
    ref = linear_logprob_ref(h64, w64, y)
    (g_ref,) = torch.autograd.grad(ref.sum(), (h64,))
    zmax = (h64 @ w64.T).abs().max().item()
    assert_close_norm(g_h, g_ref, logit_bound(EPS32, zmax, V, D, T), "hidden gradient")
    with torch.no_grad():
        assert K.linear_logprob(h, w, y).grad_fn is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(backend="cuda"), "backend"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    h, w, y = _inputs(torch.float32)
    with pytest.raises(ValueError, match=match):
        K.linear_logprob(h, w, y, **kwargs)


def test_bad_shapes_and_triton_on_cpu_raise(monkeypatch):
    h, w, y = _inputs(torch.float32)
    with pytest.raises(ValueError, match="target shape"):
        K.linear_logprob(h, w, y[:-1])
    with pytest.raises(ValueError, match="weight must be"):
        K.linear_logprob(h, w[:, :-1], y)
    with pytest.raises(ValueError, match="integer"):
        K.linear_logprob(h, w, y.float())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        K.linear_logprob(h, w, y, backend="triton")


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_entropy_accurate_for_large_logits(temperature):
    # Logits with std ~50 / temperature: entropy is centred on the row max, not lse - E[z].
    g = torch.Generator().manual_seed(6)
    h = 4 * torch.randn(32, 64, generator=g)
    w = torch.randn(1000, 64, generator=g)
    y = torch.randint(0, 1000, (32,), generator=g)
    lp, ent = K.linear_logprob(h, w, y, temperature=temperature, return_entropy=True)
    lp64, ent64 = linear_logprob_ref(
        h.double(), w.double(), y, temperature=temperature, return_entropy=True
    )
    torch.testing.assert_close(ent.double(), ent64, rtol=0, atol=2e-5)
    torch.testing.assert_close(lp.double(), lp64, rtol=1e-6, atol=2e-4)
