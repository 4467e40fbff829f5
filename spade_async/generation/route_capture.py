"""The CPU engine's ``--enable-return-routed-experts``: the top-k experts each token took.

SGLang's ``RoutedExpertsCapturer`` (``state_capturer/routed_experts.py``) records, for every
token a forward runs and every MoE layer, the int32 top-k expert ids the router chose, and
a finished request returns the rows ``[routed_experts_start_len, seqlen - 1)`` base64-encoded
(``routed_experts.py`` has the wire form). Here a forward hook on each router module
(transformers' ``*TopKRouter``: ``(logits, scores, indices)``) keeps the indices of the
forward in flight; the engine hands each sequence the rows of its real tokens
(``Sequence.routes``: position-tagged chunks, a later chunk overwriting an earlier one, as a
preempted request recomputes its context) and ``assemble`` builds the reply.

These are the routes the engine really took, in its own dtype and batch: a bf16 engine
routes some tokens differently from an fp32 trainer, which is what R3 corrects.

Legend: N tokens of one forward (rows x columns, padding included), R rows, W columns
(positions) of a row, L MoE layers, K top-k.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

__all__ = ["RouteCapture", "of", "keep", "assemble"]

_ROUTER = re.compile(r"layers\.(\d+)\.mlp\.gate$")


def routers(model: Any) -> list[torch.nn.Module]:
    """The router module of every MoE layer, in layer order (empty for a dense model)."""
    found = {}
    for name, module in model.named_modules():
        m = _ROUTER.search(name)
        if m and type(module).__name__.endswith("TopKRouter"):
            found[int(m.group(1))] = module
    return [found[i] for i in sorted(found)]


class RouteCapture:
    """Forward hooks on ``model``'s routers; ``take()`` -> ids ``[N, L, K]`` of the last forward."""

    def __init__(self, model: Any) -> None:
        self.routers = routers(model)
        self._ids: list[torch.Tensor | None] = [None] * len(self.routers)
        for layer, module in enumerate(self.routers):
            module.register_forward_hook(self._hook(layer))

    def _hook(self, layer: int):
        def keep(_module, _args, output) -> None:
            self._ids[layer] = output[2]  # router_indices [N, K]

        return keep

    def take(self) -> torch.Tensor:
        if any(t is None for t in self._ids):
            raise RuntimeError("a forward ran without reaching every MoE router")
        ids_NLK = torch.stack([t.to(torch.int32) for t in self._ids], dim=1)
        self._ids = [None] * len(self.routers)
        return ids_NLK


def of(model: Any) -> RouteCapture:
    """The capture of ``model`` (hooks installed once per model object: a swapped-in model
    gets its own)."""
    cap = getattr(model, "_spade_route_capture", None)
    if cap is None:
        cap = RouteCapture(model)
        model._spade_route_capture = cap
    return cap


def keep(model: Any, seqs, rows, width: int, first_pos: list[int], n: list[int]) -> None:
    """The last forward's routes (``rows x width`` tokens, left-padded): sequence ``i`` gets
    the last ``n[i]`` columns of row ``rows[i]``, its positions from ``first_pos[i]``."""
    ids_NLK = of(model).take()
    ids_RWLK = ids_NLK.view(-1, width, *ids_NLK.shape[1:])
    for seq, row, pos, k in zip(seqs, rows, first_pos, n, strict=True):
        if seq.want_routes:
            seq.routes.append((pos, ids_RWLK[row, width - k :].clone()))


def assemble(chunks: list[tuple[int, torch.Tensor]], seqlen: int, start: int) -> np.ndarray:
    """Rows ``[start, seqlen - 1)`` from position-tagged chunks ``(first position, [n, L, K])``."""
    end = max(seqlen - 1, start)
    if not chunks:
        return np.zeros((end - start, 0, 0), dtype=np.int32)
    _, first = chunks[0]
    out = np.zeros((end, *first.shape[1:]), dtype=np.int32)
    for pos, ids in chunks:
        n = min(len(ids), end - pos)
        if n > 0:
            out[pos : pos + n] = ids[:n].numpy()
    return out[start:]
