"""The CPU engine's request and control records, shared by its two halves (engine.py, the
lock-guarded control; engine_batch.py, the scheduler thread's batch work)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import torch

from spade_async.generation.protocol import FinishReason, SamplingParams

__all__ = ["EngineBusy", "Sequence", "Swap"]


class EngineBusy(RuntimeError):
    """A request the engine cannot take in its current state (memory released, or busy)."""


@dataclass
class Sequence:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text_end: int | None = None  # stop-string trim position in the decoded text
    weight_version: str = ""  # the weights of the last token
    priority: int = 0  # the waiting queue's order under priority scheduling (Engine)
    arrival: int = 0  # submission order (ties of priority; the newest is preempted first)
    preemptions: int = 0  # times it was taken out of the batch for a higher priority
    # --enable-return-routed-experts and the request asked (route_capture.py): the rows
    # from route_start on; routes holds (first position, ids [n, L, K]) per forward
    want_routes: bool = False
    route_start: int = 0
    routes: list = field(default_factory=list)

    def context(self) -> list[int]:
        """What a prefill runs on: the prompt, and the tokens generated before a preemption
        (the request resumes where it was, as SGLang's retracted requests do)."""
        return self.prompt_ids + self.output_ids if self.output_ids else self.prompt_ids

    # (version, tokens generated before it was replaced) per weight swap while running
    version_events: list[tuple[str, int]] = field(default_factory=list)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class Swap:
    model: Any
    version: str
    abort: bool
    future: concurrent.futures.Future
