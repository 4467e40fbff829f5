"""Triton row pass of the one-pass policy head (head.py): one program per row of a chunk.

Shape legend: C rows (tokens) in one chunk, V vocabulary size, BLOCK_V columns per step, T
tokens of the whole call (per-token inputs, indexed by a chunk's offset).

Each program sweeps its row of raw logits twice: first the online max / sum exp / centred
sum e (z - max) (log-sum-exp, target log-prob, entropy), then, after the per-token loss
scalars of head.py's closed form (ratio, clip, TIS, low_var_kl: k3 clamped to [-10, 10]
with a zero gradient outside, entropy bonus, aggregation weight) are computed in registers, a second sweep writes d loss / d logits over the logits
in place. No C x V temporaries; the GEMMs stay in cuBLAS. fp64 rows use head.TorchHeadRows.

Side effects: importing triton. Set TRITON_INTERPRET=1 before triton is imported to run on
CPU tensors (slow; tests only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .head import TorchHeadRows
from .loss import LOW_VAR_KL_CLAMP

__all__ = ["TritonHeadRows"]


@triton.jit
def _head_rows(
    logits_ptr,
    stride_row,
    target_ptr,
    inv_temp,
    V,
    w_ptr,
    adv_ptr,
    old_ptr,
    roll_ptr,
    ref_ptr,
    clip_lo,
    clip_hi,
    tis_cap,
    kl_coef,
    ent_coef,
    lp_out,
    ent_out,
    loss_out,
    HAS_OLD: tl.constexpr,
    HAS_TIS: tl.constexpr,
    TIS_CURRENT: tl.constexpr,
    HAS_KL: tl.constexpr,
    KL_CLAMP: tl.constexpr,
    NEED_ENT: tl.constexpr,
    ENT_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    # sweep 1: online max m, s = sum exp(z - m), t = sum exp(z - m) (z - m)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = cols < V
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(tl.where(valid, z, float("-inf")), 0))
        scale = tl.exp(m - m_new)
        e = tl.where(valid, tl.exp(z - m_new), 0.0)
        if NEED_ENT:
            shift = tl.maximum(m - m_new, -1e30)  # keeps 0 * (-inf) out of the first step
            t = scale * (t + s * shift) + tl.sum(e * (z - m_new), 0)
        s = s * scale + tl.sum(e, 0)
        m = m_new
    log_s = tl.log(s)
    lse = m + log_s
    target = tl.load(target_ptr + row)
    lp = tl.load(base + target).to(tl.float32) * inv_temp - lse
    ent = log_s - t / s
    # per-token loss scalars (head.py docstring)
    w = tl.load(w_ptr + row).to(tl.float32)
    adv = tl.load(adv_ptr + row).to(tl.float32)
    if HAS_OLD:
        old = tl.load(old_ptr + row).to(tl.float32)
        ratio = tl.exp(lp - old)
    else:
        old = lp
        ratio = 1.0 + 0.0 * lp
    lo = 1.0 - clip_lo
    hi = 1.0 + clip_hi
    pg1 = -adv * ratio
    pg2 = -adv * tl.minimum(tl.maximum(ratio, lo), hi)
    pg = tl.maximum(pg1, pg2)
    a = tl.where(pg1 > pg2, 1.0, tl.where(pg1 == pg2, 0.5, 0.0))
    inside = tl.where((ratio >= lo) & (ratio <= hi), 1.0, 0.0)
    d_pg = -adv * ratio * (a + (1.0 - a) * inside)
    if HAS_TIS:
        if TIS_CURRENT:
            tis_lp = lp
        else:
            tis_lp = old
        tau = tl.minimum(tl.exp(tis_lp - tl.load(roll_ptr + row).to(tl.float32)), tis_cap)
        pg = tau * pg
        d_pg = tau * d_pg
    loss = pg
    g_lp = d_pg
    if HAS_KL:
        d = tl.load(ref_ptr + row).to(tl.float32) - lp
        ed = tl.exp(d)
        k3 = ed - d - 1.0
        kl_in = (k3 >= -KL_CLAMP) & (k3 <= KL_CLAMP)
        loss = loss + kl_coef * tl.minimum(tl.maximum(k3, -KL_CLAMP), KL_CLAMP)
        g_lp = g_lp + tl.where(kl_in, kl_coef * (1.0 - ed), 0.0)
    if ENT_GRAD:
        loss = loss - ent_coef * ent
    live = w != 0.0
    tl.store(lp_out + row, lp)
    if NEED_ENT:
        tl.store(ent_out + row, ent)
    tl.store(loss_out + row, tl.where(live, w * loss, 0.0))
    g_lp = tl.where(live, w * g_lp, 0.0) * inv_temp
    g_ent = tl.where(live, -ent_coef * w, 0.0) * inv_temp
    # sweep 2: grad = g_lp ([v = y] - p) - g_H p (log p + H), log p = (z - m) - log s
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = cols < V
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temp
        zs = z - m
        p = tl.exp(zs - log_s)
        if ENT_GRAD:
            grad = -p * (g_lp + g_ent * (zs - log_s + ent))
        else:
            grad = -p * g_lp
        grad = tl.where(cols == target, grad + g_lp, grad)
        tl.store(base + cols, grad.to(logits_ptr.dtype.element_ty), mask=valid)


class TritonHeadRows:
    """Row pass for head.PolicyHead backed by ``_head_rows`` (fp64 -> TorchHeadRows)."""

    temporaries = 0

    def __init__(self, block_v: int | None = None, num_warps: int = 8):
        self.block_v = block_v
        self.num_warps = num_warps

    def __call__(self, logits_CV, target_C, inv_temp, terms, want_ent):
        if logits_CV.dtype == torch.float64:
            return TorchHeadRows()(logits_CV, target_C, inv_temp, terms, want_ent)
        C, V = logits_CV.shape
        assert logits_CV.stride(1) == 1, "logits chunk must be row-major"
        out = torch.empty(3, C, dtype=torch.float32, device=logits_CV.device)
        lp_C, ent_C, loss_C = out[0], out[1], out[2]
        w = terms.token_weight_T.contiguous()
        vec = {k: (v.contiguous() if v is not None else w) for k, v in terms.tensors().items()}
        has_kl = bool(terms.kl_coef) and terms.ref_logprob_T is not None
        ent_grad = bool(terms.entropy_coef)
        _head_rows[(C,)](
            logits_CV,
            logits_CV.stride(0),
            target_C.contiguous(),
            float(inv_temp),
            V,
            w,
            vec["advantage_T"],
            vec["old_logprob_T"],
            vec["rollout_logprob_T"],
            vec["ref_logprob_T"],
            float(terms.clip_low),
            float(terms.clip_high),
            float(terms.tis_cap),
            float(terms.kl_coef),
            float(terms.entropy_coef),
            lp_C,
            ent_C,
            loss_C,
            HAS_OLD=terms.old_logprob_T is not None,
            HAS_TIS=terms.rollout_logprob_T is not None,
            TIS_CURRENT=bool(terms.tis_current),
            HAS_KL=has_kl,
            KL_CLAMP=LOW_VAR_KL_CLAMP,
            NEED_ENT=want_ent or ent_grad,
            ENT_GRAD=ent_grad,
            BLOCK_V=self.block_v or min(triton.next_power_of_2(V), 4096),
            num_warps=self.num_warps,
        )
        return logits_CV, lp_C, (ent_C if want_ent or ent_grad else None), loss_C
