"""One-pass policy head: the PPO loss AND its gradient w.r.t. hidden and head weight, per chunk.

Shape legend: T tokens, C tokens in one chunk, D hidden size, V vocabulary size.

Why: the recompute head (logprob.py) does 4 T x V x D products (logits; in backward the
logits again, grad_h, grad_W). The policy loss's gradient w.r.t. each token's log-prob is a
closed form in that log-prob and quantities known before the pass, so the gradient w.r.t.
the logits can be written while the logits are still in the chunk buffer: 3 products, the
floor. Per chunk of C tokens (``PolicyHead.forward``):

    1. logits_CV = hidden_CD @ weight_VD.T                        (GEMM 1, into one buffer)
    2. one row pass: log-sum-exp, target log-prob, entropy, the token's loss and
       d loss / d logits, written over logits_CV in place (Triton on CUDA, torch elsewhere)
    3. grad_hidden_CD = grad_CV @ weight_VD                       (GEMM 2)
    4. grad_weight_VD += grad_CV.T @ hidden_CD                    (GEMM 3, addmm into one fp32
                                                                   V x D buffer, no temporary)

``backward`` only multiplies the stored gradients by the upstream scalar. Chunks are sized
by a memory budget (``chunk_bytes``: the C x V buffer plus the row pass's temporaries), not
by T / (V / D).

The closed form. Per token t: z = logits / temperature, p = softmax(z), y the target,
lp = z_y - lse(z), H = -sum_v p_v log p_v. Inputs: advantage A, old log-prob o (None: the
current policy itself, detached, so ratio = 1), rollout log-prob q (TIS), reference log-prob
r (low_var_kl), per-token aggregation weight w (``loss.loss_weights``: mask / denominator for
"token", mask / (n_s * denominator) for "seq-mean-token-mean", mask / denominator for
"seq-mean-token-sum"; every ``loss_agg`` is a weighted token sum with weights known before
the pass), clip range [1 - eps_lo, 1 + eps_hi], TIS cap c, KL coefficient beta, entropy
coefficient eta:

    rho   = exp(lp - o)
    pg    = max(pg1, pg2),  pg1 = -A rho,  pg2 = -A clamp(rho, 1 - eps_lo, 1 + eps_hi)
    tau   = min(exp(o - q), c)      (detached; 1 without q; exp(lp - q) with tis_current)
    k3    = exp(r - lp) - (r - lp) - 1,   kl = clamp(k3, -10, 10)   (slime's low_var_kl)
    l_t   = tau pg + beta kl - eta H,          loss = sum_t w_t l_t

    d pg / d lp = -A rho (a + (1 - a) [1 - eps_lo <= rho <= 1 + eps_hi]),
                  a = 1 if pg1 > pg2, 1/2 if pg1 == pg2, 0 otherwise   (torch.maximum's and
                  torch.clamp's subgradients, so this equals autograd through policy_loss)
    d kl / d lp = (1 - exp(r - lp)) [-10 <= k3 <= 10]     (torch.clamp's gradient)
    g_lp = w (tau d pg / d lp + beta d kl / d lp),     g_H = -w eta

    d lp / d z_v = [v = y] - p_v
    d H  / d z_v = -p_v (log p_v + H)
        (H = -sum_u p_u log p_u and d p_u / d z_v = p_u ([u = v] - p_v) give
         -(log p_v + 1) p_v + p_v sum_u p_u (log p_u + 1) = -p_v log p_v - p_v + p_v (1 - H))

    d l / d logits_v = (1 / temperature) (g_lp ([v = y] - p_v) - g_H p_v (log p_v + H))

Tokens with w_t = 0 (masked) get l_t = 0 and a zero gradient whatever their inputs hold.
With log p_v = (z_v - max) - log s and s = sum exp(z - max), the row pass needs the row
twice: once for max / s / sum e (z - max) (online, centred: no cancellation in H), once to
write the gradient; every per-row scalar is computed in fp32 (fp64 for fp64 inputs).

Memory beyond inputs and outputs: the C x V chunk buffer (input dtype), on the torch path
one C x V fp32 temporary for entropy and one fp32 copy for sub-fp32 inputs; the fp32 grad
accumulator V x D (the weight gradient any path builds; for a bf16/fp16 weight it is
narrowed in place into its own storage, no second V x D copy), grad_hidden T x D; O(T)
vectors. Outputs: the scalar loss (differentiable w.r.t. hidden and weight), and the
detached per-token log-probs (and entropy) for metrics. One backward per forward (the stored
gradients are scaled in place).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch

from .logprob import acc_dtype
from .loss import LOW_VAR_KL_CLAMP

__all__ = [
    "HeadOut",
    "PolicyHead",
    "PolicyTerms",
    "TorchHeadRows",
    "chunk_rows",
    "token_terms",
]

# Bytes of chunk buffer + row-pass temporaries: 64 MiB on CPU (T=4096, V=49,152 fp32: 320
# rows, peak ~0.08x naive), 256 MiB on GPU (V=151,936 bf16: 832 rows; keeps the T=16k head
# under 0.1x naive's memory next to the 2.4 GB fp32 weight-gradient accumulator).
DEFAULT_CHUNK_BYTES = {"cpu": 64 << 20, "cuda": 256 << 20}


class HeadOut(NamedTuple):
    loss: torch.Tensor  # 0-d, differentiable w.r.t. hidden and weight
    logprob_T: torch.Tensor  # detached, fp32 (fp64 for fp64 inputs)
    entropy_T: torch.Tensor | None  # detached, when return_entropy or entropy_coef


@dataclass(frozen=True)
class PolicyTerms:
    """Per-token loss inputs ([T], any float dtype; None = term off) and the scalars.

    Everything per token can be sharded along T (``index``), so a sequence-parallel caller
    computes the weights globally and hands each rank its tokens.
    """

    token_weight_T: torch.Tensor  # loss.loss_weights(...): mask / denominator and per agg
    advantage_T: torch.Tensor
    old_logprob_T: torch.Tensor | None = None  # None: the current policy (detached)
    rollout_logprob_T: torch.Tensor | None = None  # TIS weight min(exp(old - rollout), cap)
    ref_logprob_T: torch.Tensor | None = None  # low_var_kl target (used when kl_coef != 0)
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    tis_current: bool = False  # TIS weight min(exp(lp - rollout), cap), lp detached (slime's
    # --use-rollout-logprobs --use-tis: the ratio is against the rollout)

    def index(self, index: torch.Tensor | slice) -> PolicyTerms:
        """The same terms restricted to some tokens (a slice or an index tensor)."""
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                kw[f.name] = v[index]
        return replace(self, **kw)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name.endswith("_T")}

    def check(self, shape: torch.Size) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip_low={self.clip_low}, clip_high={self.clip_high} must be >= 0")
        if not self.tis_cap > 0:
            raise ValueError(f"tis_cap={self.tis_cap} must be > 0")
        if self.kl_coef and self.ref_logprob_T is None:
            raise ValueError(f"kl_coef={self.kl_coef} needs ref_logprob_T")
        for name, t in self.tensors().items():
            if t is not None and t.shape != shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != target shape {tuple(shape)}")


def token_terms(
    lp_C: torch.Tensor, ent_C: torch.Tensor | None, terms: PolicyTerms
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token (w * l_t, g_lp, g_H) from log-probs and entropies: the module docstring's
    closed form in plain torch (the CPU row pass; the Triton kernel repeats it per row)."""
    acc = lp_C.dtype
    w = terms.token_weight_T.to(acc)
    adv = terms.advantage_T.to(acc)
    live = w != 0
    if terms.old_logprob_T is None:
        old = lp_C
        ratio = torch.ones_like(lp_C)
    else:
        old = terms.old_logprob_T.to(acc)
        ratio = (lp_C - old).exp()
    lo, hi = 1.0 - terms.clip_low, 1.0 + terms.clip_high
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(lo, hi)
    pg = torch.maximum(pg1, pg2)
    a = torch.where(pg1 > pg2, 1.0, torch.where(pg1 == pg2, 0.5, 0.0)).to(acc)
    inside = ((ratio >= lo) & (ratio <= hi)).to(acc)
    d_pg = -adv * ratio * (a + (1 - a) * inside)
    if terms.rollout_logprob_T is not None:
        base = lp_C if terms.tis_current else old
        tau = (base - terms.rollout_logprob_T.to(acc)).exp().clamp(max=terms.tis_cap)
        pg, d_pg = tau * pg, tau * d_pg
    loss, g = pg, d_pg
    if terms.kl_coef:
        d = terms.ref_logprob_T.to(acc) - lp_C
        ed = d.exp()
        k3 = ed - d - 1.0
        inside = (k3 >= -LOW_VAR_KL_CLAMP) & (k3 <= LOW_VAR_KL_CLAMP)
        loss = loss + terms.kl_coef * k3.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
        g = g + torch.where(inside, terms.kl_coef * (1.0 - ed), 0.0)
    g_ent = None
    if terms.entropy_coef:
        loss = loss - terms.entropy_coef * ent_C
        g_ent = torch.where(live, -terms.entropy_coef * w, 0.0)
    zero = torch.zeros((), dtype=acc, device=lp_C.device)
    return torch.where(live, w * loss, zero), torch.where(live, w * g, zero), g_ent


class TorchHeadRows:
    """The row pass in plain torch: in place in the chunk buffer, 1 C x V fp32 temporary
    with entropy (the exp, kept beside the shifted logits), none without."""

    temporaries = 1

    def __call__(self, logits_CV, target_C, inv_temp, terms, want_ent):
        """-> (grad over logits_CV (the buffer itself, or an fp32 tensor for sub-fp32 inputs),
        lp_C, ent_C or None, loss_C)."""
        z = logits_CV.to(acc_dtype(logits_CV.dtype))  # no copy when already fp32/fp64
        if inv_temp != 1.0:
            z.mul_(inv_temp)
        z_y = z.gather(1, target_C.unsqueeze(1)).squeeze(1)
        m = z.amax(dim=1, keepdim=True)
        zs = z.sub_(m)  # z - max <= 0, in place
        need_h = want_ent or bool(terms.entropy_coef)
        if need_h:
            e = zs.exp()  # C x V temporary
        else:
            e = zs.exp_()  # in place: the shifted logits are not needed again
        s = e.sum(1)
        log_s = s.log()
        lp = z_y - m.squeeze(1) - log_s
        ent = None
        if need_h:
            ent = log_s - torch.linalg.vecdot(e, zs) / s
        loss_C, g_lp, g_ent = token_terms(lp, ent, terms)
        g_lp = g_lp * inv_temp
        if g_ent is None:
            grad = e.mul_((-g_lp / s).unsqueeze(1))  # -g_lp p
        else:
            # -p (g_lp + g_H (log p + H)), log p = zs - log s: p * (b zs + a)
            g_ent = g_ent * inv_temp
            b = -g_ent / s
            a = -(g_lp + g_ent * (ent - log_s)) / s
            grad = zs.mul_(b.unsqueeze(1)).add_(a.unsqueeze(1)).mul_(e)
        grad.scatter_add_(1, target_C.unsqueeze(1), g_lp.unsqueeze(1))
        return grad, lp, ent, loss_C


def chunk_rows(vocab: int, bytes_per_logit: int, budget: int) -> int:
    """Rows per chunk so the buffer and the row pass's temporaries fit ``budget`` bytes
    (rounded down to a multiple of 64 rows when that many fit: GEMM-friendly)."""
    rows = budget // max(1, vocab * bytes_per_logit)
    return max(1, rows // 64 * 64 if rows >= 64 else rows)


_OUT_DTYPE_ADDMM: list[bool] = []  # [] untried, [True] works, [False] this torch lacks it


def _addmm_acc_(acc_VD: torch.Tensor, grad_CV: torch.Tensor, grad32_CV, hidden_CD) -> None:
    """acc_VD += grad_CV.T @ hidden_CD in acc_VD's dtype without a V x D temporary."""
    if grad_CV.dtype == acc_VD.dtype:
        acc_VD.addmm_(grad_CV.T, hidden_CD)
        return
    if grad32_CV is not None:  # torch path, sub-fp32 input: the fp32 gradient is at hand
        acc_VD.addmm_(grad32_CV.T, hidden_CD.to(acc_VD.dtype))
        return
    if acc_VD.is_cuda and _OUT_DTYPE_ADDMM != [False]:
        # cuBLAS: bf16/fp16 products accumulated straight into the fp32 buffer (torch >= 2.8)
        try:
            torch.addmm(acc_VD, grad_CV.T, hidden_CD, out_dtype=acc_VD.dtype, out=acc_VD)
            _OUT_DTYPE_ADDMM[:] = [True]
            return
        except (RuntimeError, TypeError):
            if _OUT_DTYPE_ADDMM == [True]:
                raise
            _OUT_DTYPE_ADDMM[:] = [False]
    # fp32 copies of this chunk (C x V and C x D, inside the chunk budget's order), no V x D
    acc_VD.addmm_(grad_CV.T.to(acc_VD.dtype), hidden_CD.to(acc_VD.dtype))


def _narrow_(acc_VD: torch.Tensor, dtype: torch.dtype, block: int = 4096) -> torch.Tensor:
    """acc_VD converted to ``dtype`` inside its own storage (the first bytes), block by block:
    block j's bytes land on rows already read (or on itself, from a block-sized copy)."""
    if acc_VD.dtype == dtype:
        return acc_VD
    V, D = acc_VD.shape
    if torch.finfo(dtype).bits * 2 != torch.finfo(acc_VD.dtype).bits:
        return acc_VD.to(dtype)
    out = acc_VD.view(-1).view(dtype)[: V * D].view(V, D)
    for s in range(0, V, block):
        e = min(V, s + block)
        out[s:e].copy_(acc_VD[s:e].to(dtype))
    return out


class PolicyHead(torch.autograd.Function):
    """autograd.Function over (hidden_TD, weight_VD): see the module docstring."""

    @staticmethod
    def forward(
        ctx, hidden_TD, weight_VD, target_T, terms, inv_temp, want_ent, rows, row_pass, needs
    ):
        T, V = hidden_TD.shape[0], weight_VD.shape[0]
        dev, dtype = hidden_TD.device, hidden_TD.dtype
        acc = acc_dtype(dtype)
        need_h, need_w = needs  # the caller's view (grad mode is off in here)
        out_ent = want_ent or bool(terms.entropy_coef)
        lp_T = torch.empty(T, dtype=acc, device=dev)
        ent_T = torch.empty(T, dtype=acc, device=dev) if out_ent else None
        loss_T = torch.empty(T, dtype=acc, device=dev)
        grad_h = torch.empty_like(hidden_TD) if need_h else None
        grad_w = torch.zeros(weight_VD.shape, dtype=acc, device=dev) if need_w else None
        buf = torch.empty(min(rows, T), V, dtype=dtype, device=dev)
        weight_DV = weight_VD.T
        for s in range(0, T, rows):
            e = min(T, s + rows)
            h_CD = hidden_TD[s:e]
            logits = torch.mm(h_CD, weight_DV, out=buf[: e - s])
            part = terms.index(slice(s, e))
            grad, lp, ent, loss = row_pass(logits, target_T[s:e], inv_temp, part, out_ent)
            lp_T[s:e] = lp
            loss_T[s:e] = loss
            if out_ent:
                ent_T[s:e] = ent
            if not (need_h or need_w):
                continue
            grad32 = None
            if grad.dtype != dtype:  # torch rows on sub-fp32 inputs: fp32 gradient
                grad32 = grad
                grad = logits.copy_(grad)
            if need_h:
                torch.mm(grad, weight_VD, out=grad_h[s:e])
            if need_w:
                _addmm_acc_(grad_w, grad, grad32, h_CD)
        del buf
        # plain attributes, not save_for_backward: backward scales them in place (one
        # backward per forward; a second one raises instead of returning scaled garbage)
        ctx.grads = (grad_h, grad_w)
        ctx.weight_dtype = weight_VD.dtype
        ctx.mark_non_differentiable(lp_T, *([ent_T] if out_ent else []))
        loss = loss_T.sum()
        if out_ent:
            return loss, lp_T, ent_T
        return loss, lp_T

    @staticmethod
    def backward(ctx, g_loss, *_):
        if ctx.grads is None:
            raise RuntimeError(
                "policy_head: a second backward through one forward; the gradients it stored "
                "were consumed by the first (run the forward again)"
            )
        grad_h, grad_w = ctx.grads
        ctx.grads = None
        if grad_h is not None:
            grad_h = grad_h.mul_(g_loss.to(grad_h.dtype))
        if grad_w is not None:
            grad_w = _narrow_(grad_w.mul_(g_loss.to(grad_w.dtype)), ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None
