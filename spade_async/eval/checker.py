"""Trusted library checkers (math-verify) in spawn worker processes.

math-verify's timeouts use ``signal.alarm``, which fails off a process's main thread; a
``ProcessPoolExecutor`` worker runs each call on its main thread, so the library's own
timeout works there, and a parent-side wall-clock limit backs it up: a call that overruns
kills every worker of the pool (a new pool starts) and scores 0. Nothing model-written is
*executed* here: these processes only parse and compare strings with trusted libraries.
Side effects: worker processes start lazily (spawn, ~1 s each).
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import anyio

__all__ = ["Checker", "CheckTimeout", "math_equal"]


class CheckTimeout(Exception):
    """A checker call ran past its wall-clock limit."""


class Checker:
    def __init__(self, workers: int = 2, timeout_s: float = 30.0) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
            return self._pool

    def _kill(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        for p in list((pool._processes or {}).values()):  # no public API to kill a hung task
            p.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def call_sync(self, fn, *args: Any) -> Any:
        for attempt in (0, 1):
            pool = self._executor()
            try:
                fut = pool.submit(fn, *args)
                return fut.result(timeout=self.timeout_s)
            except FutureTimeout:
                self._kill(pool)
                raise CheckTimeout(f"{fn.__name__} ran past {self.timeout_s:g} s") from None
            except BrokenProcessPool:  # another call's timeout killed this pool: retry once
                self._kill(pool)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def call(self, fn, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(self.call_sync, fn, *args, abandon_on_cancel=True)

    def close(self) -> None:
        if self._pool is not None:
            self._kill(self._pool)

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- functions that run in the worker processes (module level: picklable) ------------------


def math_equal(gold: str, pred: str, timeout_s: int = 5) -> bool:
    """math-verify on ``\\boxed{gold}`` vs ``\\boxed{pred}``, exact string compare as fallback."""
    from math_verify import parse, verify

    if pred.strip() == gold.strip():
        return True
    try:
        g = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout_s)
        p = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout_s)
        return bool(g and p and verify(g, p, timeout_seconds=timeout_s))
    except Exception:  # noqa: BLE001 - a checker failure on odd input is a wrong answer
        return False
