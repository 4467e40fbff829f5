"""Typed records of evaluation: items, samples (one JSONL line each), results."""

from __future__ import annotations

from typing import Any

import msgspec

from spade_async.config import Doc

__all__ = ["Item", "Sample", "Sampling", "SuiteResult", "Results", "EvalConfig"]


class Sampling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    n: Doc(int, "samples per problem (k of avg@k, pass@k, maj@k)") = 1
    temperature: Doc(float, "sampling temperature") = 1.0
    top_p: Doc(float, "nucleus sampling") = 1.0
    top_k: Doc(int, "top-k sampling; -1 = off") = -1
    min_p: Doc(float, "min-p sampling") = 0.0
    max_tokens: Doc(int, "new tokens per completion (per turn for multi-turn suites)") = 4096


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One problem of a suite: chat messages to send and the gold answer."""

    id: str
    messages: list[dict[str, Any]]
    answer: str
    meta: dict[str, Any] = {}


class Sample(msgspec.Struct, kw_only=True):
    """One generated (or re-scored) completion; one line of ``<suite>.jsonl``."""

    id: str
    sample: int
    prompt: str
    completion: str
    answer: str
    extracted: str | None
    score: float
    error: str | None = None
    transcript: list[dict[str, Any]] | None = None
    policy_version: int | None = None


class SuiteResult(msgspec.Struct, kw_only=True):
    suite: str
    metrics: dict[str, float]
    n_problems: int
    samples: int
    k: int
    settings: Sampling
    model: str
    policy_version: int | None
    notes: list[str] = []


class Results(msgspec.Struct, kw_only=True):
    """``results.json``: written once, atomically, when every suite has finished."""

    model: str
    policy_version: int | None
    complete: bool
    suites: dict[str, SuiteResult]
    seconds: float = 0.0


class EvalConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[eval]`` in a recipe: held-out evaluation during training."""

    interval: Doc(int, "evaluate every this many policy versions; 0 = never") = 0
    suites: Doc(list[str], "suite names (see `spade eval --help`)") = msgspec.field(
        default_factory=lambda: ["aime25"]
    )
    n: Doc(int, "samples per problem; 0 = each suite's default (as max_tokens)") = 0
    limit: Doc(int, "problems per suite; 0 = all") = 0
    max_tokens: Doc(int, "new tokens per completion; 0 = each suite's default") = 0
    before_train: Doc(bool, "also evaluate the initial policy (version 0)") = False
    concurrency: Doc(int, "most evaluation requests in flight at once") = 16
    data: Doc(
        dict[str, str],
        "data paths of user-file suites and SUITE.OPTION keys, e.g. {gpqa_diamond = 'gpqa.csv'}",
    ) = {}
    overrides: Doc(
        dict[str, dict[str, float]],
        "per-suite sampling, e.g. {aime25 = {n = 32, temperature = 0.7, top_p = 0.8}}",
    ) = {}
