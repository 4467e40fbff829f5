"""A virtual clock for the controller's own event loop: asyncio, with time that jumps.

``VirtualLoop`` is an asyncio selector loop whose ``time()`` is a counter. When nothing is
ready to run, instead of sleeping until the next timer it moves the counter to that timer
(trio's ``MockClock(autojump_threshold=0)`` in asyncio form), so anyio's ``sleep``,
``move_on_after`` and ``current_time`` -- everything the loop waits on -- run in simulated
seconds, and a simulated hour costs only the controller's own CPU.

Work on other threads would not be waited for by a jumping clock: the clock would move on
while a thread ran, and the thread's result would land at a virtual time set by the real
machine's speed (a run not repeatable). So ``run_virtual`` runs every thread hand-off
inline, taking no virtual time: ``anyio.to_thread.run_sync`` (swapped for the run's
duration) and the loop's ``run_in_executor`` (``asyncio.to_thread``). When the loop has no
timer and nothing ready it waits a real moment for some other thread, then reports a
deadlock instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

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

    def run_in_executor(self, executor, func, *args) -> asyncio.Future:
        """Inline, in no virtual time (see the module docstring)."""
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:  # the caller's await raises it, as from a thread
            fut.set_exception(exc)
        return fut


async def _inline_run_sync(func: Callable[..., T], *args: Any, **_: Any) -> T:
    """``anyio.to_thread.run_sync`` in the loop's own thread (a checkpoint, then the call)."""
    await anyio.lowlevel.checkpoint()
    return func(*args)


@contextlib.contextmanager
def _threads_inline():
    was = anyio.to_thread.run_sync
    anyio.to_thread.run_sync = _inline_run_sync
    try:
        yield
    finally:
        anyio.to_thread.run_sync = was


def run_virtual(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``anyio.run(fn, *args)`` on a ``VirtualLoop``, thread hand-offs inline."""
    with _threads_inline():
        return anyio.run(
            fn, *args, backend="asyncio", backend_options={"loop_factory": VirtualLoop}
        )
