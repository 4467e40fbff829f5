"""Triton row ops for the chunked linear log-prob (the GPU path; CPU under TRITON_INTERPRET=1).

Shape legend: C rows (tokens) in one chunk, V vocabulary size, BLOCK_V columns per step.

The logits matmul stays in cuBLAS (torch.mm in logprob.py); these kernels replace the
softmax-side torch ops with one streaming pass per row, like Liger-Kernel's cross-entropy
kernel: forward reads logits_CV once (online max / sum / sum e*z), backward reads it once
and writes grad_logits_CV in place into the same buffer, so the chunk needs no temporaries
beyond the C x V logits buffer itself. Liger's fused linear cross-entropy is not used as is:
it folds a scalar loss's gradient into the forward, while our API returns per-token
log-probs (and entropy) with an arbitrary upstream gradient.

Side effects: importing triton. Set TRITON_INTERPRET=1 before triton is imported to run
these kernels on CPU tensors (slow; tests only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .logprob import TorchRowOps

__all__ = ["TritonRowOps"]


@triton.jit
def _row_stats_fwd(
    logits_ptr,
    stride_row,
    target_ptr,
    inv_temp,
    V,
    logprob_ptr,
    lse_ptr,
    entropy_ptr,
    HAS_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    m = tl.full((), float("-inf"), tl.float32)  # running max of z
    s = tl.zeros((), tl.float32)  # sum exp(z - m)
    t = tl.zeros((), tl.float32)  # sum exp(z - m) * (z - m), centred: no cancellation
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = cols < V
        # Padding columns load 0 (finite, so e * z never meets 0 * inf) and are masked out.
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(tl.where(valid, z, float("-inf")), 0))
        scale = tl.exp(m - m_new)
        e = tl.where(valid, tl.exp(z - m_new), 0.0)
        if HAS_ENTROPY:
            # Re-centre t from m to m_new; the clamp keeps 0 * (-inf) out of the first step.
            shift = tl.maximum(m - m_new, -1e30)
            t = scale * (t + s * shift) + tl.sum(e * (z - m_new), 0)
        s = s * scale + tl.sum(e, 0)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(target_ptr + row)
    z_y = tl.load(base + target).to(tl.float32) * inv_temp
    tl.store(logprob_ptr + row, z_y - lse)
    tl.store(lse_ptr + row, lse)
    if HAS_ENTROPY:
        tl.store(entropy_ptr + row, tl.log(s) - t / s)


@triton.jit
def _row_grad_bwd(
    logits_ptr,
    stride_row,
    target_ptr,
    inv_temp,
    V,
    lse_ptr,
    entropy_ptr,
    g_lp_ptr,
    g_ent_ptr,
    HAS_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # grad_logits = inv_temp * (g_lp * (onehot - p) - g_ent * p * (log p + H)), in place.
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    lse = tl.load(lse_ptr + row)
    target = tl.load(target_ptr + row)
    g_lp = tl.load(g_lp_ptr + row).to(tl.float32) * inv_temp
    if HAS_ENTROPY:
        g_ent = tl.load(g_ent_ptr + row).to(tl.float32) * inv_temp
        ent = tl.load(entropy_ptr + row)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = cols < V
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temp
        logp = z - lse
        p = tl.exp(logp)
        if HAS_ENTROPY:
            grad = -p * (g_lp + g_ent * (logp + ent))
        else:
            grad = -p * g_lp
        grad = tl.where(cols == target, grad + g_lp, grad)
        tl.store(base + cols, grad.to(logits_ptr.dtype.element_ty), mask=valid)


class TritonRowOps:
    """RowOps backed by the two kernels above (fp64 falls back to TorchRowOps)."""

    def __init__(self, block_v: int | None = None, num_warps: int = 8):
        self.block_v = block_v
        self.num_warps = num_warps

    def _block(self, V: int) -> int:
        return self.block_v or min(triton.next_power_of_2(V), 4096)

    def forward(self, logits_CV, target_C, inv_temp, entropy):
        if logits_CV.dtype == torch.float64:
            return TorchRowOps().forward(logits_CV, target_C, inv_temp, entropy)
        C, V = logits_CV.shape
        assert logits_CV.stride(1) == 1, "logits chunk must be row-major"
        out = torch.empty(3 if entropy else 2, C, dtype=torch.float32, device=logits_CV.device)
        logprob_C, lse_C = out[0], out[1]
        entropy_C = out[2] if entropy else None
        _row_stats_fwd[(C,)](
            logits_CV,
            logits_CV.stride(0),
            target_C.contiguous(),
            float(inv_temp),
            V,
            logprob_C,
            lse_C,
            entropy_C if entropy else lse_C,
            HAS_ENTROPY=entropy,
            BLOCK_V=self._block(V),
            num_warps=self.num_warps,
        )
        return logprob_C, lse_C, entropy_C

    def backward_(self, logits_CV, target_C, lse_C, entropy_C, g_lp_C, g_ent_C, inv_temp):
        if logits_CV.dtype == torch.float64:
            return TorchRowOps().backward_(
                logits_CV, target_C, lse_C, entropy_C, g_lp_C, g_ent_C, inv_temp
            )
        C, V = logits_CV.shape
        has_ent = g_ent_C is not None
        lse_C = lse_C.contiguous()
        g_lp_C = g_lp_C.contiguous()  # autograd may hand an expanded (stride-0) gradient
        _row_grad_bwd[(C,)](
            logits_CV,
            logits_CV.stride(0),
            target_C.contiguous(),
            float(inv_temp),
            V,
            lse_C,
            entropy_C.contiguous() if has_ent else lse_C,
            g_lp_C,
            g_ent_C.contiguous() if has_ent else g_lp_C,
            HAS_ENTROPY=has_ent,
            BLOCK_V=self._block(V),
            num_warps=self.num_warps,
        )
        return logits_CV
