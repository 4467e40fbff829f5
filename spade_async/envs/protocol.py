"""Wire protocol between the pool (parent) and a sandboxed environment worker.

Length-prefixed msgpack frames on two dedicated pipe fds (never stdout/stderr, which the
environment may scribble on): a 4-byte little-endian payload length and a 4-byte request
number, then one msgspec ``Struct`` from a tagged union. Requests flow parent -> worker,
replies worker -> parent, strictly one reply per request, carrying the request's number
(``Ready`` carries 0).

Nothing a worker sends is trusted: the environment's code runs in the worker's interpreter
and can replace its handler or write frames of its own. The parent (``replies.py``) checks
every reply's type, number and values against the contract, and kills a worker that breaks
the protocol.

This module is imported on BOTH sides: inside the sandbox it is loaded as the top-level
module ``protocol`` next to ``worker.py`` and sees only the standard library and msgspec,
so it must not import anything from ``spade_async``.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

HEADER = struct.Struct("<II")  # payload length, request number

# --- requests (parent -> worker) -------------------------------------------------------


class Open(msgspec.Struct, tag="open", array_like=True):
    """Load ``source`` (once per worker) and create instance ``instance`` of its env class
    (``env_class``: the name the static stage found; empty = the worker's own search)."""

    instance: int
    env_id: str
    source: str
    kwargs: dict[str, Any] = {}
    env_class: str = ""


class Reset(msgspec.Struct, tag="reset", array_like=True):
    instance: int
    seed: int | None = None


class Step(msgspec.Struct, tag="step", array_like=True):
    instance: int
    action: str


class Solution(msgspec.Struct, tag="solution", array_like=True):
    instance: int


class GetTools(msgspec.Struct, tag="tools", array_like=True):
    instance: int


class Close(msgspec.Struct, tag="close", array_like=True):
    instance: int


Request = Open | Reset | Step | Solution | GetTools | Close

# --- replies (worker -> parent) --------------------------------------------------------


class Ready(msgspec.Struct, tag="ready", array_like=True):
    """Sent once after boot: imports done, limits and syscall filter installed."""

    pid: int
    seccomp: bool


class Opened(msgspec.Struct, tag="opened", array_like=True):
    env_class: str  # the module-level name the class was found under (not its __name__)


class ResetOk(msgspec.Struct, tag="reset_ok", array_like=True):
    obs: str
    info: dict[str, Any]


class StepOk(msgspec.Struct, tag="step_ok", array_like=True):
    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Value(msgspec.Struct, tag="value", array_like=True):
    """Result of ``solution()`` / ``get_tools()`` (already converted to builtins)."""

    value: Any


class Closed(msgspec.Struct, tag="closed", array_like=True):
    pass


class Err(msgspec.Struct, tag="err", array_like=True):
    """A failure the worker survived. ``kind`` is one of ERROR_KINDS."""

    kind: str
    message: str


Reply = Ready | Opened | ResetOk | StepOk | Value | Closed | Err

# Classified failure kinds. The worker itself reports: exception, contract, structure,
# memory, output_too_large, crash (sys.exit). The parent adds timeout, crash (worker died),
# lost (instance on a worker that died earlier), busy (no worker capacity), boot, and
# protocol (a reply of the wrong type or number, an unsolicited frame, a non-plain value).
ERROR_KINDS = (
    "timeout",
    "crash",
    "memory",
    "output_too_large",
    "exception",
    "contract",
    "structure",
    "lost",
    "busy",
    "boot",
    "protocol",
)
# the kinds a worker may report in an ``Err`` (the others only the parent decides)
WORKER_KINDS = frozenset(
    {"exception", "contract", "structure", "memory", "output_too_large", "crash", "lost"}
)


def frame(payload: bytes, seq: int) -> bytes:
    return HEADER.pack(len(payload), seq) + payload
