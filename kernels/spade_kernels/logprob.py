"""Chunked linear log-prob / entropy with a custom backward (never holds T x V logits).

Shape legend: T tokens, C tokens in one chunk (C <= T), D hidden size, V vocabulary size.

    logprob_T[t] = log_softmax(hidden_TD @ weight_VD.T / temperature)[t, target_T[t]]
    entropy_T[t] = -sum_v p_TV[t, v] * log p_TV[t, v]

Forward: per chunk of C tokens, logits_CV = hidden_CD @ weight_VD.T, then per-row
logsumexp, target logit and (optionally) entropy. Only lse_T and entropy_T are kept.
Backward recomputes logits_CV per chunk, turns it in place into grad_logits_CV and does
grad_hidden_CD = grad_logits_CV @ weight_VD and grad_weight_VD += grad_logits_CV.T @ hidden_CD.

Memory beyond inputs and outputs: the logits_CV buffer (C * V * itemsize) plus at most two
C x V fp32 temporaries in the torch row ops (logsumexp's, or exp and product with entropy;
C=512, V=49,152: 96 MB each), none in the Triton row ops; the fp32 grad_weight_VD
accumulator (V * D * 4 bytes, as big as the weight gradient the naive path builds too); O(T)
vectors (lse_T, entropy_T). Nothing grows with T x V. Cost: one extra logits matmul
(2*T*V*D flops) in backward, the price of not storing T x V activations; on CPU the smaller
working set of each chunk makes up for it (bench/logprob.py).

Row ops are pluggable: `TorchRowOps` here (CPU and any device), `TritonRowOps` in
triton_logprob.py (one fused pass per row, in place). Gradients reach hidden and weight
(tied embeddings included: the caller passes the same tensor; autograd sums), and through
entropy when it is returned and used.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["ChunkedLinearLogprob", "RowOps", "TorchRowOps", "acc_dtype", "default_chunk_size"]

# Logits elements per chunk: 24M (96 MB fp32; 512 tokens at V=49,152). On a 2-core CPU at
# T=4096, V=49,152, D=576, chunked matmuls of 256-341 rows ran ~15-20% slower than one
# full matmul while 512-row ones matched it; peak memory grows by one C x V buffer per
# step and stays ~1/9 of the naive peak there (bench/logprob.py --sweep). Chunks are
# rounded down to a multiple of 64 rows (BLAS-friendly).
_CHUNK_ELEMS = 24 * 1024 * 1024


def default_chunk_size(vocab: int, device: torch.device) -> int:
    """Tokens per chunk so a chunk's logits hold about _CHUNK_ELEMS (GPU: 4x more)."""
    elems = _CHUNK_ELEMS * (4 if device.type == "cuda" else 1)
    rows = elems // max(1, vocab)
    return max(1, rows // 64 * 64 if rows >= 64 else rows)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax math and outputs: fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class RowOps(Protocol):
    """Per-row softmax statistics and their gradient, on one chunk of raw logits."""

    def forward(
        self, logits_CV: torch.Tensor, target_C: torch.Tensor, inv_temp: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> (logprob_C, lse_C, entropy_C or None), fp32; lse is of logits * inv_temp.
        May overwrite logits_CV."""
        ...

    def backward_(
        self,
        logits_CV: torch.Tensor,
        target_C: torch.Tensor,
        lse_C: torch.Tensor,
        entropy_C: torch.Tensor | None,
        g_lp_C: torch.Tensor,
        g_ent_C: torch.Tensor | None,
        inv_temp: float,
    ) -> torch.Tensor:
        """-> grad of sum(g_lp*logprob + g_ent*entropy) w.r.t. raw logits, C x V, fp32 or
        the logits' dtype; may reuse logits_CV's storage."""
        ...


class TorchRowOps:
    """Row ops in plain torch, in place where possible (2 C x V temporaries at most)."""

    def forward(self, logits_CV, target_C, inv_temp, entropy):
        z_CV = logits_CV.to(acc_dtype(logits_CV.dtype))  # no copy when already fp32
        if inv_temp != 1.0:
            z_CV.mul_(inv_temp)
        z_target_C = z_CV.gather(1, target_C.unsqueeze(1)).squeeze(1)
        max_C1 = z_CV.amax(dim=-1, keepdim=True)
        zs_CV = z_CV.sub_(max_C1)  # shifted in place: z - max <= 0
        if not entropy:
            # logsumexp in place: torch.logsumexp would allocate (and page-fault) a C x V temp.
            lse_C = max_C1.squeeze(1) + zs_CV.exp_().sum(-1).log()
            return z_target_C - lse_C, lse_C, None
        e_CV = zs_CV.exp()  # C x V temporary
        sum_C = e_CV.sum(-1)
        ezs_C = torch.linalg.vecdot(e_CV, zs_CV)  # sum_v e * (z - max)
        lse_C = max_C1.squeeze(1) + sum_C.log()
        entropy_C = sum_C.log() - ezs_C / sum_C  # centred on max: no cancellation
        return z_target_C - lse_C, lse_C, entropy_C

    def backward_(self, logits_CV, target_C, lse_C, entropy_C, g_lp_C, g_ent_C, inv_temp):
        # d/dz: g_lp * (onehot - p) + g_ent * (-p * (log p + H)); z = logits * inv_temp.
        acc = acc_dtype(logits_CV.dtype)
        g_lp_C = g_lp_C.to(acc) * inv_temp
        logp_CV = logits_CV.to(acc)
        if inv_temp != 1.0:
            logp_CV.mul_(inv_temp)
        logp_CV.sub_(lse_C.unsqueeze(1))
        if g_ent_C is None:
            grad_CV = logp_CV.exp_().mul_(-g_lp_C.unsqueeze(1))  # -p * g_lp, in place
        else:
            g_ent_C = g_ent_C.to(acc) * inv_temp
            p_CV = logp_CV.exp()  # C x V temporary
            coef_CV = logp_CV.add_(entropy_C.unsqueeze(1)).mul_(g_ent_C.unsqueeze(1))
            grad_CV = coef_CV.add_(g_lp_C.unsqueeze(1)).mul_(p_CV).neg_()
        grad_CV.scatter_add_(1, target_C.unsqueeze(1), g_lp_C.unsqueeze(1))
        return grad_CV


def _chunks(T: int, C: int):
    for start in range(0, T, C):
        yield start, min(start + C, T)


class ChunkedLinearLogprob(torch.autograd.Function):
    """autograd.Function over (hidden_TD, weight_VD, target_T); see module docstring."""

    @staticmethod
    def forward(ctx, hidden_TD, weight_VD, target_T, temperature, return_entropy, chunk, ops):
        T, V = hidden_TD.shape[0], weight_VD.shape[0]
        inv_temp = 1.0 / temperature
        dev, acc = hidden_TD.device, acc_dtype(hidden_TD.dtype)
        logprob_T = torch.empty(T, dtype=acc, device=dev)
        lse_T = torch.empty(T, dtype=acc, device=dev)
        entropy_T = torch.empty(T, dtype=acc, device=dev) if return_entropy else None
        buf_CV = torch.empty(min(chunk, T), V, dtype=hidden_TD.dtype, device=dev)
        weight_DV = weight_VD.T
        for s, e in _chunks(T, chunk):
            logits_CV = torch.mm(hidden_TD[s:e], weight_DV, out=buf_CV[: e - s])
            lp_C, lse_C, ent_C = ops.forward(logits_CV, target_T[s:e], inv_temp, return_entropy)
            logprob_T[s:e] = lp_C
            lse_T[s:e] = lse_C
            if return_entropy:
                entropy_T[s:e] = ent_C
        del buf_CV
        ctx.save_for_backward(hidden_TD, weight_VD, target_T, lse_T, entropy_T)
        ctx.cfg = (inv_temp, return_entropy, chunk, ops)
        if return_entropy:
            return logprob_T, entropy_T
        return logprob_T

    @staticmethod
    def backward(ctx, g_lp_T, g_ent_T=None):
        hidden_TD, weight_VD, target_T, lse_T, entropy_T = ctx.saved_tensors
        inv_temp, return_entropy, chunk, ops = ctx.cfg
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_h or need_w):
            return (None,) * 7
        T, V = hidden_TD.shape[0], weight_VD.shape[0]
        dev, dtype = hidden_TD.device, hidden_TD.dtype
        grad_h_TD = torch.empty_like(hidden_TD) if need_h else None
        # fp32 accumulator: V x D x 4 bytes.
        acc = acc_dtype(dtype)
        grad_w_VD = torch.zeros(weight_VD.shape, dtype=acc, device=dev) if need_w else None
        buf_CV = torch.empty(min(chunk, T), V, dtype=dtype, device=dev)
        weight_DV = weight_VD.T
        for s, e in _chunks(T, chunk):
            hidden_CD = hidden_TD[s:e]
            logits_CV = torch.mm(hidden_CD, weight_DV, out=buf_CV[: e - s])
            g_ent_C = g_ent_T[s:e] if return_entropy else None
            ent_C = entropy_T[s:e] if return_entropy else None
            grad_CV = ops.backward_(
                logits_CV, target_T[s:e], lse_T[s:e], ent_C, g_lp_T[s:e], g_ent_C, inv_temp
            )
            if grad_CV.dtype != dtype:
                grad_CV = grad_CV.to(dtype)  # low-precision matmuls; fp32 accumulation below
            if need_h:
                torch.mm(grad_CV, weight_VD, out=grad_h_TD[s:e])
            if need_w:
                if grad_CV.dtype == acc:
                    grad_w_VD.addmm_(grad_CV.T, hidden_CD)
                else:
                    grad_w_VD.add_(grad_CV.T @ hidden_CD)
        grad_w = grad_w_VD.to(weight_VD.dtype) if need_w else None
        return grad_h_TD, grad_w, None, None, None, None, None
