"""The Triton row-op kernels (the GPU path) run under Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is first imported (triton.language's own helpers
are decorated at import), so the default run starts this module again in a child pytest
with TRITON_INTERPRET=1; the interpreter tests run there and are skipped in the parent.
Shape legend: T tokens, D hidden, V vocabulary.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import spade_kernels as K
import torch
from numerics import assert_close_norm, logit_bound
from spade_kernels.reference import linear_logprob_ref

T, V, D = 19, 123, 31  # interpreter runs one Python program per row: keep T small
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
child_only = pytest.mark.skipif(
    not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child of test_under_interpreter"
)
N_CHILD_TESTS = 5 + 6 + 2  # + the one-pass head's, + its low_var_kl clamp against slime


@pytest.mark.skipif(INTERPRETED, reason="this is the parent")
@pytest.mark.timeout(300)  # ~10 s on an idle 2-core box; generous for a loaded one
def test_under_interpreter():
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=280)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) == N_CHILD_TESTS, tail


@pytest.fixture(scope="module")
def interp():
    import spade_kernels.triton_logprob as mod
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(mod._row_stats_fwd, InterpretedFunction)
    return mod


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, D, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(V, D, generator=g)).to(dtype).requires_grad_()
    return h, w, torch.randint(0, V, (T,), generator=g)


def _loss_and_grads(fn, h, w, y, **kw):
    lp, ent = fn(h, w, y, return_entropy=True, **kw)
    g = torch.Generator().manual_seed(9)
    g_lp, g_ent = torch.randn(T, generator=g), torch.randn(T, generator=g)
    grads = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), (h, w))
    return lp.detach(), ent.detach(), grads


def _bound(h, w, dtype, temperature):
    """numerics.logit_bound for these inputs: the compute dtype's logit rounding + fp32 sums."""
    zmax = (h.detach().double() @ w.detach().double().T / temperature).abs().max().item()
    return logit_bound(torch.finfo(dtype).eps, zmax, V, D, T)


@child_only
@pytest.mark.parametrize(
    "dtype, temperature",
    [(torch.float32, 1.0), (torch.float32, 0.7), (torch.bfloat16, 0.7)],
)
def test_triton_rows_match_reference(interp, dtype, temperature):
    from spade_kernels.logprob import ChunkedLinearLogprob

    h, w, y = _inputs(dtype)
    ops = interp.TritonRowOps(block_v=64, num_warps=1)  # V=123: 2 blocks, last partial

    def fused(h, w, y, return_entropy):
        return ChunkedLinearLogprob.apply(h, w, y, temperature, return_entropy, 7, ops)

    got = _loss_and_grads(fused, h, w, y)
    # float64 reference on the same (already rounded) inputs
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    ref = _loss_and_grads(linear_logprob_ref, h64, w64, y, temperature=temperature)
    rel = _bound(h, w, dtype, temperature)
    assert_close_norm(got[0], ref[0], rel, "log-probs")
    assert_close_norm(got[1], ref[1], rel, "entropies")
    for a, b in zip(got[2], ref[2], strict=True):
        assert a.dtype == dtype
        assert_close_norm(a, b, rel, "gradients")


@child_only
def test_dispatch_backend_triton_without_entropy(interp):
    h, w, y = _inputs(torch.float32, seed=2)
    lp = K.linear_logprob(h, w, y, chunk_size=8, backend="triton")
    (g_w,) = torch.autograd.grad(lp.sum(), (w,))
    h64, w64 = h.detach().double(), w.detach().double().requires_grad_()
    ref = linear_logprob_ref(h64, w64, y)
    (g_ref,) = torch.autograd.grad(ref.sum(), (w64,))
    rel = _bound(h, w, torch.float32, 1.0)
    assert_close_norm(lp.detach(), ref.detach(), rel, "log-probs")
    assert_close_norm(g_w, g_ref, rel, "weight gradient")


@child_only
def test_triton_entropy_accurate_for_large_logits(interp):
    g = torch.Generator().manual_seed(6)
    h = 4 * torch.randn(8, 64, generator=g)
    w = torch.randn(300, 64, generator=g)
    y = torch.randint(0, 300, (8,), generator=g)
    lp, ent = K.linear_logprob(h, w, y, temperature=0.6, return_entropy=True, backend="triton")
    lp64, ent64 = linear_logprob_ref(
        h.double(), w.double(), y, temperature=0.6, return_entropy=True
    )
    torch.testing.assert_close(ent.double(), ent64, rtol=0, atol=2e-5)
    torch.testing.assert_close(lp.double(), lp64, rtol=1e-6, atol=2e-4)


HEAD_CASES = [(agg, opt) for agg in K.AGGREGATIONS for opt in ("all", "detached_entropy")]


@child_only
@pytest.mark.parametrize("agg, option", HEAD_CASES)
def test_triton_head_rows_match_float64(interp, agg, option):
    """The one-pass head's Triton row pass (kernels/triton_head.py) against float64
    references and against the torch row pass, every loss option on: bounds as in
    tests/kernels/test_head.py."""
    import test_head as th
    from spade_kernels.dispatch import policy_head
    from spade_kernels.triton_head import TritonHeadRows

    opt = {"all": th.OPTIONS["all"], "detached_entropy": dict(tis=True, entropy=0.05)}[option]
    h, w, y, x = th._data(seed=1, t=T)
    terms = th._terms(x, opt, agg)
    rows = TritonHeadRows(block_v=64, num_warps=1)  # V=123: 2 blocks, the last partial
    got = policy_head(h, w, y, terms, temperature=0.8, backend="torch")  # for the comparison
    assert isinstance(rows, TritonHeadRows)
    import spade_kernels.dispatch as dispatch

    orig = dispatch._head_rows
    dispatch._head_rows = lambda backend, device: rows
    try:
        out = policy_head(h, w, y, terms, temperature=0.8, chunk_bytes=7 * th.V * 4)
    finally:
        dispatch._head_rows = orig
    grads = torch.autograd.grad(out.loss, (h, w))
    ref_loss, ref_lp, ref_grads = th._ref64(h, w, y, x, opt, agg, 0.8)
    rel = th._bound(h, w, y, x, 0.8)
    assert_close_norm(out.logprob_T, ref_lp.detach(), rel, "log-probs")
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close_norm(a, b, rel, "gradients vs float64")
    for a, b in zip(grads, torch.autograd.grad(got.loss, (h, w)), strict=True):
        assert_close_norm(a, b.double(), 2 * rel, "gradients vs torch rows")
    scale = max(abs(ref_loss.item()), terms.token_weight_T.abs().sum().item())
    assert abs(out.loss.item() - ref_loss.item()) <= 10 * rel * scale


@child_only
@pytest.mark.parametrize("tis_current", [False, True])
def test_triton_head_rows_clamp_low_var_kl_as_slime(interp, tis_current):
    """The Triton row pass (kernels/triton_head.py ``_head_rows``) on tokens with
    |ref - logprob| up to 20, on both sides of the clamp's edges: slime's low_var_kl (the
    value clamped to [-10, 10], no gradient outside) and, with ``tis_current``, its
    rollout-mode TIS weight, against tests/slime_reference.py in float64 on the same
    (already rounded) inputs; the fp32 bound of tests/kernels/test_head.py."""
    import slime_reference as slime
    import test_head as th
    import test_slime_loss as ts
    from spade_kernels.head import PolicyTerms
    from spade_kernels.triton_head import TritonHeadRows

    h, w, y, x = th._data(seed=3, t=T)
    h64, w64 = h.detach().double(), w.detach().double()
    lp64, _ = slime.head_logprobs(h64, w64, y, 0.8)
    d = torch.linspace(-20.0, 20.0, T, dtype=torch.float64)
    d[: len(ts.EDGES)] = torch.tensor(ts.EDGES, dtype=torch.float64)
    x["ref"] = (lp64 + d).float()  # fp32 inputs, as the trainer's; edges 1e-2 from k3 = 10
    if tis_current:
        x["old"] = x["roll"]
    terms = PolicyTerms(
        K.loss_weights(x["mask"].double(), "token"),  # float64 weights, as the trainer's
        x["adv"],
        old_logprob_T=x["old"],
        rollout_logprob_T=x["roll"],
        ref_logprob_T=x["ref"],
        kl_coef=0.5,
        tis_current=tis_current,
    )
    rows = TritonHeadRows(block_v=64, num_warps=1)
    import spade_kernels.dispatch as dispatch

    orig = dispatch._head_rows
    dispatch._head_rows = lambda backend, device: rows
    try:
        out = K.policy_head(h, w, y, terms, temperature=0.8, chunk_bytes=7 * th.V * 4)
    finally:
        dispatch._head_rows = orig
    grads = torch.autograd.grad(out.loss, (h, w))
    h64, w64 = h64.requires_grad_(), w64.requires_grad_()
    lp, _ = slime.head_logprobs(h64, w64, y, 0.8)
    x64 = {k: v.double() for k, v in x.items() if v.dtype.is_floating_point}
    ref_loss = slime.slime_loss(
        [lp], [x64["mask"]], [x64["adv"]], mode="per_token",
        old_log_probs=None if tis_current else [x64["old"]], rollout_log_probs=[x64["roll"]],
        use_rollout_logprobs=tis_current, use_tis=True, ref_log_probs=[x64["ref"]],
        kl_loss_coef=0.5,
    )  # fmt: skip
    ref_grads = torch.autograd.grad(ref_loss, (h64, w64))
    rel = th._bound(h, w, y, x, 0.8)
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close_norm(a, b, rel, "gradients vs slime in float64")
    scale = max(abs(ref_loss.item()), terms.token_weight_T.abs().sum().item())
    assert abs(out.loss.item() - ref_loss.item()) <= 10 * rel * scale


@pytest.mark.gpu
def test_triton_on_cuda_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1000, 576, generator=g).cuda().requires_grad_()
    w = (0.05 * torch.randn(49152, 576, generator=g)).cuda().requires_grad_()
    y = torch.randint(0, 49152, (1000,), generator=g).cuda()
    lp, ent = K.linear_logprob(h, w, y, return_entropy=True)
    (lp.sum() + ent.sum()).backward()
    g_h, g_w = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    lp_r, ent_r = linear_logprob_ref(h, w, y, return_entropy=True)
    (lp_r.sum() + ent_r.sum()).backward()
    torch.testing.assert_close(lp, lp_r, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(ent, ent_r, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(g_h, h.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(g_w, w.grad, rtol=1e-3, atol=1e-3)
