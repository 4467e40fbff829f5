"""A virtual clock for the controller's own event loop: asyncio, with time that jumps.

``VirtualLoop`` is an asyncio selector loop whose ``time()`` is a counter. When nothing is
ready to run, instead of sleeping until the next timer it moves the counter to that timer
(trio's ``MockClock(autojump_threshold=0)`` in asyncio form), so anyio's ``sleep``,
``move_on_after`` and ``current_time`` -- everything the loop waits on -- run in simulated
seconds, and a simulated hour costs only the controller's own CPU. Work on other threads
would not be waited for by a jumping clock: the simulator runs none (its memory writer
writes inline), and when the loop has no timer and nothing ready it waits a real moment for
a thread, then reports a deadlock instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["VirtualLoop", "Deadlock", "run_virtual"]

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is set: the simulated run can never go on."""


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer: only another thread could wake us
            events = super().select(self._loop.grace_s)
            if not events:
                raise Deadlock(
                    f"virtual time {self._loop.time():.1f} s: every task is waiting and no "
                    "timer is set"
                )
            return events
        self._loop.advance(timeout)
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop on a virtual clock (see the module docstring)."""

    grace_s = 1.0  # real seconds to wait for another thread before calling it a deadlock

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


def run_virtual(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``anyio.run(fn, *args)`` on a ``VirtualLoop``."""
    return anyio.run(fn, *args, backend="asyncio", backend_options={"loop_factory": VirtualLoop})
