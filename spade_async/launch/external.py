"""Engines started elsewhere: ``[engine] external = ["http://host:port", ...]``.

At start each URL must answer ``GET /health`` (200) and ``GET /model_info`` (or the older
``/model_info``) with SGLang's model-info JSON; anything else is one line naming the URL and
the fix (exit 2), before anything is started. During the run they are engines like the
others (health-probed, retried by the client, counted on the dashboard when down), and they
are never stopped: this run did not start them. Weights reach them by the run's push mode:
``disk`` from ``placement.weight_dir`` (a directory both nodes mount), ``distributed`` over
NCCL with ``placement.master_addr`` as the rendezvous (the trainer node's address).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import httpx
import msgspec

from spade_async.errors import ConfigError

__all__ = ["attach", "check_urls"]


class _Info(msgspec.Struct):
    model_path: str
    weight_version: str | None = None
    tp_size: int = 1


def check_urls(urls: Sequence[str]) -> list[str]:
    """Syntax only (no network): ``http(s)://host:port``, no duplicates."""
    out: list[str] = []
    for u in urls:
        url = httpx.URL(u)
        if url.scheme not in ("http", "https") or not url.host or url.port is None:
            raise ConfigError(
                f"engine.external entry {u!r} is not http://host:port; write e.g. "
                "'http://10.0.0.5:30000'"
            )
        if u.rstrip("/") in out:
            raise ConfigError(f"engine.external lists {u!r} twice")
        out.append(u.rstrip("/"))
    return out


async def _probe(http: httpx.AsyncClient, url: str) -> int:
    why = ""
    try:
        health = await http.get(url + "/health")
        if health.status_code != 200:
            why = f"GET /health answered HTTP {health.status_code}"
        else:
            info = await http.get(url + "/model_info")
            if info.status_code != 200:
                why = f"GET /model_info answered HTTP {info.status_code}"
            else:
                model = msgspec.json.decode(info.content, type=_Info)
                server = await http.get(url + "/server_info")
                if server.status_code == 200:
                    try:
                        return msgspec.json.decode(server.content, type=_Info).tp_size
                    except (msgspec.ValidationError, msgspec.DecodeError):
                        pass
                return max(1, model.tp_size)
    except httpx.HTTPError as exc:
        why = f"not reachable ({type(exc).__name__})"
    except (msgspec.ValidationError, msgspec.DecodeError):
        why = "its /model_info is not SGLang's model info (no model_path)"
    raise ConfigError(
        f"external engine {url}: {why}; start an SGLang server (or `python -m "
        "spade_async.generation.server`) there, or remove it from engine.external"
    )


async def attach(urls: Sequence[str], timeout_s: float = 10.0) -> dict[str, int]:
    """Health-check every external engine once; ``{url: tensor-parallel size}``."""
    urls = check_urls(urls)
    out: dict[str, int] = {}
    errors: list[ConfigError] = []

    async def one(http: httpx.AsyncClient, url: str) -> None:
        try:
            out[url] = await _probe(http, url)
        except ConfigError as exc:
            errors.append(exc)

    async with httpx.AsyncClient(timeout=timeout_s) as http, anyio.create_task_group() as tg:
        for u in urls:
            tg.start_soon(one, http, u)
    if errors:
        raise errors[0]
    return {u: out[u] for u in urls}
