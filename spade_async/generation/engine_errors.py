"""The generation client's errors, and the two helpers that raise them from replies.

Kept apart from ``client.py`` so that the client's route groups (``weight_client.py``) and
the client share them without importing each other. ``client.py`` re-exports the classes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from spade_async.errors import SpadeError
from spade_async.generation.routes import Endpoint
from spade_async.generation.sglang_source import PINNED

__all__ = ["EngineError", "EngineRequestError", "EngineProtocolError", "raise_all", "decode_reply"]


class EngineError(SpadeError):
    """An engine could not be reached or kept failing; the message names its URL."""


class EngineRequestError(EngineError):
    """The engine rejected the request (HTTP 4xx); the request, not the engine, is at fault."""


class EngineProtocolError(EngineError):
    """The engine does not speak the pinned SGLang API (no such route, or a reply of another
    shape): the engine, not one request, is at fault, so roles do not turn it into data and
    the run stops with this one line."""


def raise_all(errors: list[EngineError]) -> None:
    """Every engine's failure as one error line; its class when they all share one."""
    if not errors:
        return
    kinds = {type(e) for e in errors}
    cls = kinds.pop() if len(kinds) == 1 else EngineError
    raise cls("; ".join(sorted(str(e) for e in errors)))


def decode_reply(decoder: msgspec.json.Decoder, body: bytes, url: str, ep: Endpoint) -> Any:
    """The reply as the endpoint's struct; anything else is one EngineError naming both."""
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise EngineProtocolError(
            f"engine {url} sent an unexpected {ep.method} {ep.path} reply ({exc}): "
            f"{body[:200]!r}; is it SGLang {PINNED} or the CPU engine?"
        ) from None
