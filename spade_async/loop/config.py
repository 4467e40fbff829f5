"""``pipeline`` settings of the async schedule (a leaf: ``recipe`` reads it without
importing the loop)."""

from __future__ import annotations

from typing import Literal

import msgspec

from spade_async.config import Doc

__all__ = ["PipelineConfig"]


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    queue_groups: Doc(
        int, "finished environment groups buffered for the trainer (backpressure; 0 = hand-off)"
    ) = 0
    groups_in_flight: Doc(
        int,
        "most environment groups played at once (a memory cap; admission is also bounded by "
        "staleness: groups started <= (versions trained + 1 + max_staleness) x groups per step)",
    ) = 8
    groups_per_step: Doc(
        int, "groups per trainer step; 0 = as many environments as a sync step plays"
    ) = 0
    pause_mode: Doc(
        Literal["in_place", "abort", "retract"],
        "engine pause around the engine-side weight update: retract requeues running requests "
        "and flushes the KV cache, so no token reuses KV of older weights; in_place keeps "
        "requests and their KV cache (no flush: later requests may reuse old-weight prefixes); "
        "abort ends them",
    ) = "retract"
    regen_overlap: Doc(
        bool,
        "async: design the next regeneration window in the background while the engines play "
        "the current window's environments again (counted as pipeline/carried_groups), instead "
        "of admitting no group until the designer's batch is generated and validated; off under "
        "deterministic = true (the rng would be drawn in timing order). 8B games, 6+2 on 8 x "
        "H100, simulated: 5-6% shorter steps at max_staleness 1 and 2, max sample age unchanged "
        "(bench/async_lab.py)",
    ) = True
