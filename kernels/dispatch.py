"""Backend choice for linear_logprob: Triton row ops on CUDA, plain-torch row ops elsewhere.

Shape legend: T tokens (any leading shape is flattened into T), D hidden, V vocabulary.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .logprob import ChunkedLinearLogprob, TorchRowOps, default_chunk_size

__all__ = ["linear_logprob", "triton_available"]

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
