"""Decode attention that skips the left padding of the CPU engine's batch.

Legend: B rows, T cached positions.

The engine keeps one KV cache ``[B, H, T, D]`` for all running rows, left-padded to the
longest. Each row's real positions are a contiguous suffix ``[start_b, T)``. A decode step's
attention reads all T columns of every row: with an 86-token and a 579-token prompt in one
batch, most of what the short rows read is padding, and on a CPU decode attention is bound
by that read (at batch 30, T = 700 it cost as much as half the step's matmuls).

The engine keeps rows ordered by ``start`` (longest first), so rows with similar starts are
contiguous, and hands this module a *plan* before each decode step: a few row ranges, each
with the first column any of its rows needs. Attention runs once per range on views
``key[r0:r1, :, c0:]`` (no copy), through transformers' own SDPA function, so the numbers
are SDPA's. Prefill, single rows, and any call without a matching plan use SDPA unchanged.

Registered with transformers' ``AttentionInterface`` under ``NAME``; its masks are SDPA's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["NAME", "enable", "plan_ranges", "using_plan"]

NAME = "spade_ragged_sdpa"
MAX_RANGES = 4  # each range is one more SDPA call per layer
_local = threading.local()


def enable(model: Any) -> bool:
    """Switch a model on SDPA to the ragged decode attention; False if it uses another one."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    _register()
    model.config._attn_implementation = NAME
    return True


def plan_ranges(start_B: list[int], T: int) -> list[tuple[int, int, int]]:
    """Row ranges ``(r0, r1, c0)`` for rows ordered by ascending ``start``: a new range opens
    where a row would read more padding than half its real length, at most ``MAX_RANGES``
    (then the two cheapest neighbours merge)."""
    ranges: list[list[int]] = []
    for b, start in enumerate(start_B):
        if ranges and start - ranges[-1][2] <= (T - start) // 2:
            ranges[-1][1] = b + 1
        else:
            ranges.append([b, b + 1, start])
    while len(ranges) > MAX_RANGES:
        costs = [(ranges[i + 1][1] - ranges[i + 1][0]) * (ranges[i + 1][2] - ranges[i][2])
                 for i in range(len(ranges) - 1)]  # fmt: skip
        i = costs.index(min(costs))
        ranges[i][1] = ranges[i + 1][1]
        del ranges[i + 1]
    return [(r0, r1, c0) for r0, r1, c0 in ranges]


@contextlib.contextmanager
def using_plan(mask_BT: torch.Tensor) -> Iterator[None]:
    """Plan the next forward's decode attention from the engine's 2D mask (rows sorted by
    their first real column)."""
    B, T = mask_BT.shape
    start_B = (T - mask_BT.sum(1)).tolist()
    plan = plan_ranges(start_B, T) if B > 1 and start_B == sorted(start_B) else None
    _local.plan = (B, T, plan)
    try:
        yield
    finally:
        _local.plan = None


def _attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    current = getattr(_local, "plan", None)
    B, _, q_len, _ = query.shape
    if (
        current is None
        or current[2] is None
        or q_len != 1
        or attention_mask is None
        or (B, key.shape[2]) != current[:2]
        or current[2] == [(0, B, 0)]
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [
        sdpa_attention_forward(module, query[r0:r1], key[r0:r1, :, c0:], value[r0:r1, :, c0:],
                               attention_mask[r0:r1, ..., c0:], **kwargs)[0]
        for r0, r1, c0 in current[2]
    ]  # fmt: skip
    return torch.cat(outs, dim=0), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
