"""Backend choice for linear_logprob: Triton row ops on CUDA, plain-torch row ops elsewhere.

Shape legend: T tokens (any leading shape is flattened into T), D hidden, V vocabulary.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .head import DEFAULT_CHUNK_BYTES, HeadOut, PolicyHead, PolicyTerms, TorchHeadRows, chunk_rows
from .logprob import ChunkedLinearLogprob, TorchRowOps, default_chunk_size

__all__ = ["linear_logprob", "policy_head", "triton_available"]

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _row_ops(backend: str, device: torch.device):
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}; pick one of them")
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "torch":
        return TorchRowOps()
    if not triton_available():
        raise RuntimeError("backend='triton' needs the triton package; pip install triton")
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            f"backend='triton' got {device.type} tensors; Triton runs on CUDA, or on CPU "
            "only with TRITON_INTERPRET=1 set before triton is imported"
        )
    from .triton_logprob import TritonRowOps

    return TritonRowOps()


def linear_logprob(
    hidden_TD: torch.Tensor,
    weight_VD: torch.Tensor,
    target_T: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int | None = None,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of target_T under softmax(hidden_TD @ weight_VD.T / temperature).

    Outputs are fp32 (fp64 for fp64 inputs).

    Returns logprob_T, or (logprob_T, entropy_T) when `return_entropy`. Both are
    differentiable w.r.t. hidden and weight (custom backward, chunked over tokens so no
    T x V tensor is ever held). `hidden` may have leading dims [..., D]; target then has
    shape [...] and the outputs too. `chunk_size` is tokens per chunk (default: ~24M logits
    elements on CPU, 96M on GPU). `backend`: "auto" (Triton on CUDA when installed, else
    torch), "torch" or "triton".
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} must be > 0 (1.0 is plain softmax)")
    if hidden_TD.shape[-1] != weight_VD.shape[-1] or weight_VD.ndim != 2:
        raise ValueError(
            f"hidden {tuple(hidden_TD.shape)} and weight {tuple(weight_VD.shape)} disagree: "
            "weight must be [V, D] with D = hidden.shape[-1]"
        )
    if target_T.shape != hidden_TD.shape[:-1]:
        raise ValueError(
            f"target shape {tuple(target_T.shape)} must equal hidden.shape[:-1] = "
            f"{tuple(hidden_TD.shape[:-1])}"
        )
    if target_T.dtype.is_floating_point:
        raise ValueError(f"target dtype {target_T.dtype} must be an integer type (token ids)")
    lead = target_T.shape
    hidden_TD = hidden_TD.reshape(-1, hidden_TD.shape[-1])
    target_T = target_T.reshape(-1).long()
    if weight_VD.dtype != hidden_TD.dtype:
        raise ValueError(
            f"hidden dtype {hidden_TD.dtype} != weight dtype {weight_VD.dtype}; cast one of them"
        )
    if chunk_size is None:
        chunk_size = default_chunk_size(weight_VD.shape[0], hidden_TD.device)
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if hidden_TD.shape[0] == 0:
        empty = hidden_TD.new_zeros(lead, dtype=torch.float32) + 0 * hidden_TD.sum()
        return (empty, empty.clone()) if return_entropy else empty
    ops = _row_ops(backend, hidden_TD.device)
    out = ChunkedLinearLogprob.apply(
        hidden_TD.contiguous(),
        weight_VD,
        target_T,
        float(temperature),
        return_entropy,
        int(chunk_size),
        ops,
    )
    if return_entropy:
        return out[0].reshape(lead), out[1].reshape(lead)
    return out.reshape(lead)


def _head_rows(backend: str, device: torch.device):
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}; pick one of them")
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "torch":
        return TorchHeadRows()
    _row_ops("triton", device)  # the same refusals as linear_logprob's
    from .triton_head import TritonHeadRows

    return TritonHeadRows()


def policy_head(
    hidden_TD: torch.Tensor,
    weight_VD: torch.Tensor,
    target_T: torch.Tensor,
    terms: PolicyTerms,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_bytes: int | None = None,
    backend: str = "auto",
) -> HeadOut:
    """The policy loss of softmax(hidden_TD @ weight_VD.T / temperature) at target_T, and
    its gradient, in one pass over the vocabulary (head.py): -> HeadOut(loss, logprob_T,
    entropy_T). ``terms`` holds the per-token loss inputs ([T] like target_T) and the
    scalars; ``loss`` is sum_t token_weight_t * l_t and the only differentiable output.
    ``chunk_bytes``: memory for one chunk's logits buffer and row-pass temporaries (default
    64 MiB on CPU, 256 MiB on CUDA). ``backend``: "auto" (Triton on CUDA), "torch", "triton".
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} must be > 0 (1.0 is plain softmax)")
    if hidden_TD.ndim != 2 or weight_VD.ndim != 2 or hidden_TD.shape[1] != weight_VD.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden_TD.shape)} and weight {tuple(weight_VD.shape)} disagree: "
            "hidden must be [T, D] and weight [V, D]"
        )
    if target_T.shape != hidden_TD.shape[:1] or target_T.dtype.is_floating_point:
        raise ValueError(
            f"target {tuple(target_T.shape)} {target_T.dtype} must be integer token ids of "
            f"shape {tuple(hidden_TD.shape[:1])}"
        )
    if weight_VD.dtype != hidden_TD.dtype:
        raise ValueError(
            f"hidden dtype {hidden_TD.dtype} != weight dtype {weight_VD.dtype}; cast one of them"
        )
    terms.check(target_T.shape)
    if chunk_bytes is not None and chunk_bytes < 1:
        raise ValueError(f"chunk_bytes={chunk_bytes} must be >= 1")
    T, V = hidden_TD.shape[0], weight_VD.shape[0]
    dev = hidden_TD.device
    want_ent = return_entropy or bool(terms.entropy_coef)
    if T == 0:
        zero = (hidden_TD.sum() + weight_VD.sum()) * 0
        acc = torch.promote_types(hidden_TD.dtype, torch.float32)
        empty = hidden_TD.new_zeros(0, dtype=acc)
        return HeadOut(zero.to(acc), empty, empty.clone() if want_ent else None)
    rows_pass = _head_rows(backend, dev)
    budget = chunk_bytes or DEFAULT_CHUNK_BYTES["cuda" if dev.type == "cuda" else "cpu"]
    per_logit = size = hidden_TD.element_size()
    if isinstance(rows_pass, TorchHeadRows) or size == 8:  # fp32 copy, the exp temporary
        acc_size = max(4, size)
        per_logit += (acc_size if size < 4 else 0) + (acc_size if want_ent else 0)
    rows = chunk_rows(V, per_logit, budget)
    grad_on = torch.is_grad_enabled()
    needs = (grad_on and hidden_TD.requires_grad, grad_on and weight_VD.requires_grad)
    out = PolicyHead.apply(
        hidden_TD.contiguous(),
        weight_VD,
        target_T.long(),
        terms,
        1.0 / float(temperature),
        want_ent,
        rows,
        rows_pass,
        needs,
    )
    return HeadOut(out[0], out[1], out[2] if want_ent else None)
