"""The parent decides: every reply a worker sends is checked here, in the parent.

The environment's code runs in the worker's interpreter, so the worker's own checks are a
courtesy (they give an honest environment a precise reason), never a guarantee: code in
the environment can replace the worker's handler, hand it objects whose conversions lie
(a ``float`` subclass that is 1.0 to one check and -1e6 afterwards), or write frames of its
own to the reply pipe. So the parent decodes replies as plain msgpack values only (an
``Ext`` or timestamp is refused; no subclass survives the wire), checks that each reply
answers the request it was sent for, and applies the contract's limits itself: types,
finite rewards in range, observation and info sizes, done flags, solution and tool shapes.

``check`` raises ``ReplyError(kind, message)``; the caller kills the worker, because a
worker whose replies break the contract can no longer be trusted with anything.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from spade_async.envs import protocol as P

__all__ = ["ReplyError", "check", "decoder", "clean_text", "REWARD_RANGE"]

REWARD_RANGE = (-10.0, 10.0)  # docs/environments.md: values outside are invalid
_ANSWERS = {
    P.Open: P.Opened, P.Reset: P.ResetOk, P.Step: P.StepOk, P.Solution: P.Value,
    P.GetTools: P.Value, P.Close: P.Closed,
}  # fmt: skip
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_MAX_DEPTH = 64
_MAX_MESSAGE = 2000


class ReplyError(Exception):
    """A reply the parent refuses. ``kind``: protocol, contract or output_too_large."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def _no_ext(code: int, data: memoryview) -> Any:
    raise ReplyError("protocol", f"reply carries a msgpack extension type {code}, not plain data")


def decoder() -> msgspec.msgpack.Decoder:
    """The one reply decoder: tagged ``Reply`` union, extension types refused."""
    return msgspec.msgpack.Decoder(P.Reply, ext_hook=_no_ext)


def clean_text(text: str, limit: int = _MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` chars with every control or non-printable character escaped
    (``\\n`` -> ``\\\\n``), so a message or a name can never start a line of its own."""
    text = text[:limit]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _plain(value: Any, where: str, depth: int = 0) -> None:
    """Only dict/list/str/int/float/bool/None, exact types (no subclass), bounded depth."""
    if depth > _MAX_DEPTH:
        raise ReplyError("contract", f"{where} is nested deeper than {_MAX_DEPTH} levels")
    t = type(value)
    if t in _PLAIN_SCALARS:
        return
    if t is list:
        for item in value:
            _plain(item, where, depth + 1)
    elif t is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise ReplyError("contract", f"{where} has a non-string key {key!r:.80}")
            _plain(item, where, depth + 1)
    else:
        raise ReplyError("contract", f"{where} holds a {t.__name__}, not plain data")


def _sized(value: Any, where: str, cap: int) -> None:
    _plain(value, where)
    size = len(msgspec.msgpack.encode(value))
    if size > cap:
        raise ReplyError("output_too_large", f"{where} is {size:,} bytes encoded (cap {cap:,})")


def _obs(obs: str, where: str, cap: int) -> None:
    if len(obs) > cap:
        raise ReplyError(
            "output_too_large", f"{where} observation has {len(obs):,} chars (cap {cap:,})"
        )


def check(request: object, reply: object, limits: dict) -> object:
    """``reply`` when it is a well-formed answer to ``request`` within the contract's limits.

    ``limits`` holds ``max_obs_chars`` and ``max_info_bytes`` (the pool's ``PoolConfig``).
    An ``Err`` is returned as it is (with its kind and message checked and escaped).
    """
    if isinstance(reply, P.Err):
        if reply.kind not in P.WORKER_KINDS:
            raise ReplyError("protocol", f"worker reported an error of kind {reply.kind!r:.40}")
        return P.Err(reply.kind, clean_text(reply.message))
    expected = _ANSWERS[type(request)]
    if type(reply) is not expected:
        raise ReplyError(
            "protocol",
            f"{type(reply).__name__} answered {type(request).__name__} (expected {expected.__name__})",
        )
    max_obs, max_info = limits["max_obs_chars"], limits["max_info_bytes"]
    if isinstance(reply, P.StepOk):
        lo, hi = REWARD_RANGE
        if not math.isfinite(reply.reward) or not lo <= reply.reward <= hi:
            raise ReplyError(
                "contract", f"step() reward {reply.reward!r} is outside [{lo:g}, {hi:g}]"
            )
        _obs(reply.obs, "step()", max_obs)
        _sized(reply.info, "step() info", max_info)
    elif isinstance(reply, P.ResetOk):
        _obs(reply.obs, "reset()", max_obs)
        _sized(reply.info, "reset() info", max_info)
    elif isinstance(reply, P.Opened):
        if not reply.env_class.isidentifier() or len(reply.env_class) > 200:
            raise ReplyError(
                "protocol", f"class name {clean_text(reply.env_class, 80)!r} is not an identifier"
            )
    elif isinstance(reply, P.Value) and isinstance(request, P.Solution):
        v = reply.value
        if not (type(v) is str or (type(v) is list and all(type(a) is str for a in v))):
            raise ReplyError(
                "contract", f"solution() is {type(v).__name__}, expected str or list[str]"
            )
        size = len(v) if type(v) is str else sum(map(len, v))
        if size > max_obs:
            raise ReplyError("output_too_large", f"solution() has {size:,} chars (cap {max_obs:,})")
    elif isinstance(reply, P.Value):  # get_tools()
        if type(reply.value) is not list or not all(type(t) is dict for t in reply.value):
            raise ReplyError(
                "contract", f"get_tools() is {type(reply.value).__name__}, expected a list of dicts"
            )
        _sized(reply.value, "get_tools()", max_info)
    return reply
