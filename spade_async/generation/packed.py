"""The CPU engine's float32 linear layers through oneDNN with weights packed once.

``F.linear`` on a CPU calls a BLAS GEMM that re-packs the weight matrix on every call. In
decode the activations are a handful of rows, so that packing is most of the work: the
SmolLM2 vocab head (49,152 x 576) took 14.6 ms at 2 rows through BLAS and 6.9 ms with its
weight packed ahead in oneDNN's layout (``torch.utils.mkldnn``'s path). Across the model a
decode step was 1.2x faster at batch 1, 1.4x at 2 and 1.5x at 30 (2-core EPYC, one thread).

Where torch has it, the layer runs oneDNN's dense-in, dense-out linear
(``torch.ops.mkldnn._linear_pointwise``, inductor's CPU path) on a weight reordered once by
``_reorder_linear_weight``: same kernel, same results (bit-identical from 2 rows up), but no
``to_mkldnn`` of the input and no ``to_dense`` of a fresh output. That round trip cost as much
as the product for the vocab head: 49,152 x 256 at 32 rows took 21.0 ms, 14.9 ms without it
(25.2 against 44.2 ms at 64 rows; 9.6 against 15.9 ms for SmolLM2's head at 2 rows). Older
torch builds keep the ``mkldnn_linear`` path.

``pack(model)`` gives each float32 ``nn.Linear`` a packed copy of its weight, kept beside
the module (the parameters are untouched: weight copies, state dicts and memory release
work as before). A module uses its pack only while the weight is the one it was packed from
(same storage, same version counter): after any in-place write or a release the layer falls
back to ``F.linear`` until ``pack`` runs again. The engine packs when a model starts serving
(start, weight swap) and drops the packs when it releases weights.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinear", "pack", "packed_layers", "unpack"]

# module -> (the weight's key when packed, the packed weight, whether it is a dense-path pack)
_PACKS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor, bool]] = (
    weakref.WeakKeyDictionary()
)


def _has_pointwise() -> bool:
    try:
        return callable(torch.ops.mkldnn._linear_pointwise) and callable(
            torch.ops.mkldnn._reorder_linear_weight
        )
    except (AttributeError, RuntimeError):
        return False


_POINTWISE = _has_pointwise()


def _key(w: torch.Tensor) -> tuple:
    return (w.data_ptr(), w._version, tuple(w.shape), w.dtype)


class PackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies by its packed weight while that weight is current."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = _PACKS.get(self)
        if entry is None or x.dtype != torch.float32 or entry[0] != _key(self.weight):
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        if entry[2]:  # dense in, dense out: no reorder of the input or the output
            return torch.ops.mkldnn._linear_pointwise(
                rows.contiguous(), entry[1], self.bias, "none", [], ""
            ).reshape(*lead, -1)
        y = torch._C._nn.mkldnn_linear(rows.to_mkldnn(), entry[1], None)
        y = y.to_dense().reshape(*lead, -1)
        return y if self.bias is None else y + self.bias


def pack(model: Any) -> int:
    """Pack every float32 ``nn.Linear`` of ``model``; returns how many. No-op without oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return 0
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) not in (nn.Linear, PackedLinear):
                continue
            w = module.weight
            if w.dtype != torch.float32 or w.numel() == 0 or w.device.type != "cpu":
                continue
            module.__class__ = PackedLinear
            if _POINTWISE:
                packed_w = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            else:
                packed_w = w.detach().to_mkldnn()
            _PACKS[module] = (_key(w), packed_w, _POINTWISE)
            n += 1
    return n


def unpack(model: Any) -> None:
    """Drop the packed copies (their memory goes with them)."""
    for module in model.modules():
        _PACKS.pop(module, None)


def packed_layers(model: Any) -> int:
    """How many layers of ``model`` would use a pack now."""
    return sum(1 for m in model.modules() if m in _PACKS and _PACKS[m][0] == _key(m.weight))
