"""What of a step's recorded MoE routes the trainer can replay, and why the rest cannot.

``prepare`` reads every sample's compact routes (``generation/routed_experts.py``) once per
step and decides, per token row and MoE layer, whether that route is replayed. Nothing is
dropped silently: every token x layer a trained token depends on (positions ``0 .. last
trained index - 1`` of its sample) that is not replayed is counted under one reason:

- ``missing``: the sample came without routes (the engine sent none);
- ``misfit``: its bytes are not whole rows, or an id is outside the model's experts;
- ``partial``: the rows stop before the last trained token (a later turn of the episode came
  back without routes; ``routed_experts.check_sample``): the rows it has still replay;
- ``unset``: SGLang's ``-1`` (a padding row): that token x layer routes freely;
- ``zero``: every id of the token's row is 0 in every layer (a never-written cache slot):
  the whole row routes freely;
- ``duplicate``: a layer names one expert twice (not a top-k choice): that layer routes freely;
- ``layout``: counted in the forward (``routing.py``), when a router sees a token count
  other than the micro-batch's.

``renormalises`` names the replay weight rule of a router class: Qwen3-MoE, Qwen2-MoE and
OLMoE renormalise the top-k weights when their ``norm_topk_prob`` flag says so, Mixtral
always (its router has no flag). Other families are refused at start (``RouteRuleError``):
replaying with the wrong weights would be silent.

Legend: R route rows of the step (all samples), L MoE layers, K top-k, N samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from spade_async.generation.routed_experts import RouteError, RouteShape, check_sample

__all__ = ["REASONS", "Prepared", "RouteRuleError", "prepare", "renormalises"]

REASONS = ("missing", "misfit", "partial", "unset", "zero", "duplicate", "layout")
_FLAG = ("Qwen3Moe", "Qwen2Moe", "Olmoe")  # softmax, top-k, renormalised iff norm_topk_prob
_ALWAYS = ("Mixtral",)  # softmax, top-k, always renormalised


class RouteRuleError(ValueError):
    """A router class whose replay weight rule is not known (one line: the class, the fix)."""


def renormalises(module) -> bool:
    """Whether ``module``'s router renormalises its top-k weights (see the module docstring)."""
    name = type(module).__name__
    if name.startswith(_ALWAYS):
        return True
    if name.startswith(_FLAG) and hasattr(module, "norm_topk_prob"):
        return bool(module.norm_topk_prob)
    raise RouteRuleError(
        f"routing replay: no known weight rule for router class {name} (known: "
        f"{', '.join(_FLAG + _ALWAYS)}); set trainer.routing_replay = 'measure' or false"
    )


@dataclass
class Prepared:
    """The step's routes on the host: rows, which (row, layer) replay, and the counts."""

    all_RLK: torch.Tensor  # compact ids, every sample's rows one after the other (+1 spare)
    ok_RL: torch.Tensor  # bool: that row's route of that layer is replayed
    offset_N: torch.Tensor  # first row of each sample in all_RLK
    rows_N: torch.Tensor  # rows of each sample (0: none replayed)
    need_N: torch.Tensor  # positions a trained token depends on: 0 .. need - 1
    free: dict[str, int] = field(default_factory=dict)  # token x layer per reason (host)
    samples: dict[str, int] = field(default_factory=dict)  # samples missing / misfit / partial


def _last_trained(loss_mask) -> int:
    mask = np.asarray(loss_mask, dtype=bool)
    hits = np.flatnonzero(mask)
    return int(hits[-1]) if hits.size else 0


def prepare(samples, shape: RouteShape) -> Prepared:
    """Decode every sample's routes once (see the module docstring for the reasons)."""
    L, K = shape.layers, shape.topk
    free = dict.fromkeys(REASONS, 0)
    counted = {"missing": 0, "misfit": 0, "partial": 0}
    chunks, oks, offsets, rows, needs = [], [], [], [], []
    off = 0
    for s in samples:
        need = _last_trained(s.loss_mask)
        data, r = s.routed_experts, 0
        if not data:
            counted["missing"] += 1
            free["missing"] += need * L
        elif len(data) % shape.row_bytes:
            counted["misfit"] += 1
            free["misfit"] += need * L
        else:
            ids_RLK = np.frombuffer(data, dtype=shape.dtype).reshape(-1, L, K)
            ids_RLK = ids_RLK[: len(s.token_ids)]
            bad = (ids_RLK >= shape.experts) & (ids_RLK != shape.unset)
            if bad.any():
                counted["misfit"] += 1
                free["misfit"] += need * L
            else:
                view = memoryview(data)[: len(ids_RLK) * shape.row_bytes]  # no copy
                try:
                    check_sample(view, shape, len(s.token_ids), s.loss_mask)
                except RouteError:  # short: the rows it has still replay
                    counted["partial"] += 1
                    free["partial"] += (need - len(ids_RLK)) * L
                r = len(ids_RLK)
                ok_RL = _sane(ids_RLK, shape, free, min(r, need))
                chunks.append(torch.from_numpy(ids_RLK.copy()))  # compact until a micro-batch
                oks.append(torch.from_numpy(ok_RL))
        offsets.append(off)
        rows.append(r)
        needs.append(need)
        off += r
    dtype = torch.uint8 if shape.dtype.itemsize == 1 else torch.int16
    empty = torch.zeros((1, L, K), dtype=dtype)
    return Prepared(
        all_RLK=torch.cat([*chunks, empty]) if chunks else empty,
        ok_RL=torch.cat([*oks, torch.zeros((1, L), dtype=torch.bool)]),
        offset_N=torch.tensor(offsets or [0], dtype=torch.long),
        rows_N=torch.tensor(rows or [0], dtype=torch.long),
        need_N=torch.tensor(needs or [0], dtype=torch.long),
        free=free,
        samples=counted,
    )


def _sane(ids_RLK: np.ndarray, shape: RouteShape, free: dict[str, int], needed: int) -> np.ndarray:
    """Which (row, layer) routes are real top-k choices; the refused ones among the first
    ``needed`` rows counted by reason (a row counts under its first reason only)."""
    ids = ids_RLK.astype(np.int32)
    unset_RL = (ids == shape.unset).any(axis=-1)
    zero_R = (ids == 0).all(axis=(1, 2))
    srt = np.sort(ids, axis=-1)
    dup_RL = (srt[..., 1:] == srt[..., :-1]).any(axis=-1) if shape.topk > 1 else unset_RL & False
    dup_RL &= ~unset_RL & ~zero_R[:, None]
    unset_RL &= ~zero_R[:, None]
    free["zero"] += int(zero_R[:needed].sum()) * shape.layers
    free["unset"] += int(unset_RL[:needed].sum())
    free["duplicate"] += int(dup_RL[:needed].sum())
    return ~(unset_RL | dup_RL | zero_R[:, None])
