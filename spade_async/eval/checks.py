"""The recipe's check of ``[eval]`` (kept apart from ``inloop`` so that ``recipe`` does not
import the run loop's evaluator)."""

from __future__ import annotations

from spade_async.errors import ConfigError
from spade_async.eval.runner import settings_for
from spade_async.eval.suites import make_suite
from spade_async.eval.types import EvalConfig

__all__ = ["check"]


def check(cfg: EvalConfig) -> None:
    """Recipe check: known suite names (closest suggested), sane numbers."""
    for name in [*cfg.suites, *cfg.overrides]:
        try:
            suite = make_suite(name, dict(cfg.data))  # also checks SUITE.OPTION keys
        except Exception as exc:  # SpadeError with the suggestion
            raise ConfigError(f"eval.suites: {exc}") from None
        try:
            settings_for(suite, extra=cfg.overrides.get(name))
        except TypeError as exc:
            raise ConfigError(f"eval.overrides.{name}: {exc}") from None
    if min(cfg.interval, cfg.n, cfg.limit, cfg.max_tokens) < 0 or cfg.concurrency < 1:
        raise ConfigError("eval: interval, n, limit, max_tokens must be >= 0, concurrency >= 1")
