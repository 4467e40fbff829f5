"""SGLang's request priority (``--enable-priority-scheduling`` and its flags) as the CPU
engine follows it: what a request's ``priority`` resolves to at the server
(``PriorityPolicy``), the order the waiting queue is taken in (``waiting_order``) and which
running row a better request takes (``preemption_victim``). Each is checked against the
pinned wheel's own functions in ``tests/contract/test_sglang_priority.py``."""

from __future__ import annotations

import dataclasses
import sys

from spade_async.generation.protocol import BadRequest

__all__ = ["PriorityPolicy", "PriorityRefused", "preemption_victim", "waiting_order"]


class PriorityRefused(Exception):
    """A ``priority`` sent to a server without priority scheduling that aborts such requests."""


@dataclasses.dataclass(frozen=True)
class PriorityPolicy:
    """SGLang's request priority rules (``--enable-priority-scheduling`` and its flags):
    the tokenizer manager fills in ``default`` for a request without one and refuses values
    outside signed 64 bits; the scheduler gives a request still without one the lowest
    priority, and, with scheduling off, ignores a priority or (``abort_when_disabled``)
    aborts the request with 503."""

    enabled: bool = False
    low_first: bool = False
    default: int | None = None
    abort_when_disabled: bool = False
    # the engine's: a waiting request this much better than the worst running one takes its
    # row (SGLang's default 10); None: never (--disable-priority-preemption)
    preemption_threshold: int | None = 10

    @property
    def sign(self) -> int:
        """1 when lower values go first (``--schedule-low-priority-values-first``), else -1."""
        return 1 if self.low_first else -1

    def resolve(self, priority: int | None) -> int:
        if self.enabled and priority is None and self.default is not None:
            priority = self.default
        if priority is not None and not -(1 << 63) <= priority < (1 << 63):
            raise BadRequest(
                "priority must be a signed 64-bit integer between -9223372036854775808 and "
                "9223372036854775807"
            )
        if not self.enabled:
            if priority is not None and self.abort_when_disabled:
                raise PriorityRefused(
                    "Using priority is disabled for this server. Please send a new request "
                    "without a priority."
                )
            return 0
        if priority is None:  # the scheduler's default: served last
            return sys.maxsize if self.low_first else -sys.maxsize - 1
        return priority


def waiting_order(waiting, priority_sign: int) -> list:
    """The waiting queue (in arrival order) as SGLang's priority scheduling takes it:
    ``priority * priority_sign`` ascending, then first come first served (a stable sort;
    ``priority_sign`` is 1 with ``--schedule-low-priority-values-first``, else -1)."""
    return sorted(waiting, key=lambda q: q.priority * priority_sign)


def preemption_victim(running, seq, priority_sign: int, threshold: int) -> int | None:
    """The running row ``seq`` may take (SGLang's ``preempt_to_schedule``: the worst
    priority, the newest among equals, if ``seq`` beats it by more than ``threshold``)."""
    if not running:
        return None
    worst = max(range(len(running)), key=lambda i: (running[i].priority * priority_sign,
                                                    running[i].arrival))  # fmt: skip
    if (seq.priority - running[worst].priority) * -priority_sign > threshold:
        return worst
    return None
