"""SGLang's router (PyPI ``sglang-router``, a Rust binary) in front of the engines.

``[engine] router = true`` starts ``python -m sglang_router.launch_router --worker-urls ...
--policy cache_aware`` as a supervised child (the same start / health / restart / stop logic
as an engine, wrapped in the watchdog so it never outlives the controller). Generation goes
through the router, whose cache-aware policy keeps a prompt on the engine whose radix cache
holds its longest prefix (every turn of an episode extends the last one, so an episode
stays on one engine) and falls back to the least-loaded engine when the load is
unbalanced. Weight pushes, pauses and memory release still go to each engine directly
(``RoutedClient`` only changes where ``/generate`` is sent).

Facts from running sglang-router 0.3.2: it adds ``model``, ``log_metrics``, ``no_logs``,
``background``, ``return_hidden_states``, ``return_bytes``, ``return_entropy`` to every
forwarded ``/generate`` body (the CPU engine accepts them); it reads ``/health``,
``/server_info`` (then ``/get_server_info``) and ``/model_info`` to register a worker;
``/health`` answers 200 before any worker is registered, so readiness is ``GET /workers``
listing every worker healthy; its Prometheus exporter binds port 29000 unless told
otherwise (a second router on the node then panics), so it gets a free port here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import httpx
import msgspec

from spade_async import watchdog
from spade_async.errors import ConfigError
from spade_async.generation.client import ClientConfig, GenerationClient
from spade_async.generation.sglang import SGLangConfig, SGLangServer

__all__ = ["RouterServer", "RoutedClient", "running_router", "check_installed"]

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")


def check_installed() -> None:
    if importlib.util.find_spec("sglang_router") is None:
        raise ConfigError(
            "engine.router = true needs SGLang's router: pip install sglang-router==0.3.2 "
            "(or set engine.router = false for the built-in sticky routing)"
        )


class RouterServer(SGLangServer):
    """One ``sglang_router.launch_router`` process, supervised like an engine."""

    kind = "router"

    def __init__(
        self,
        workers: Sequence[str],
        *,
        port: int,
        host: str = "127.0.0.1",
        policy: str = "cache_aware",
        log_path: str = "",
        start_timeout_s: float = 120.0,
        max_restarts: int = 3,
        prometheus_port: int = 0,
    ) -> None:
        from spade_async.engines import free_port

        if policy not in POLICIES:
            raise ConfigError(
                f"engine.router_policy = {policy!r}: use one of {', '.join(POLICIES)}"
            )
        cfg = SGLangConfig(
            model_path="",
            gpu_ids=[0],  # build_command's checks only; the router uses no GPU
            port=port,
            host=host,
            start_timeout_s=start_timeout_s,
            max_restarts=max_restarts,
            stop_timeout_s=10.0,
            log_path=log_path,
        )
        super().__init__(cfg)
        self.workers = [w.rstrip("/") for w in workers]
        self.argv = watchdog.prefix() + [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            host,
            "--port",
            str(port),
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(prometheus_port or free_port()),
            "--log-level",
            "warn",
            "--worker-urls",
            *self.workers,
        ]
        self.env = {}

    POLL_S, READY_WORD = 0.3, "ready"

    async def _ready(self, http: httpx.AsyncClient) -> tuple[bool, str]:
        """Up when ``/workers`` lists every worker as healthy (``/health`` is 200 earlier)."""
        resp = await http.get(self.url + "/workers")
        if resp.status_code != 200:
            return False, f"/workers answered {resp.status_code}"
        healthy = _healthy_workers(resp.content)
        # first start: every engine; a restart: any (a dead engine is the engines'
        # supervisor's business, not the router's)
        ready = set(self.workers) <= healthy or bool(self.restarts and healthy)
        return ready, f"{len(healthy)}/{len(self.workers)} workers healthy"

    async def workers_health(self) -> dict[str, bool]:
        """The router's own view of its workers (for the dashboard)."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            resp = await http.get(self.url + "/workers")
        healthy = _healthy_workers(resp.content)
        return {w: w in healthy for w in self.workers}


class _Worker(msgspec.Struct):
    url: str
    is_healthy: bool = False


class _Workers(msgspec.Struct):
    workers: list[_Worker] = []


def _healthy_workers(body: bytes) -> set[str]:
    try:
        data = msgspec.json.decode(body, type=_Workers)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return set()
    return {w.url.rstrip("/") for w in data.workers if w.is_healthy}


class RoutedClient(GenerationClient):
    """``GenerationClient`` whose generation goes through the router; control calls (weight
    updates, pause, memory release, health) still fan out to every engine in ``urls``."""

    def __init__(self, router_url: str, urls: Sequence[str], config: ClientConfig | None = None):
        super().__init__(urls, config)
        self.router_url = router_url.rstrip("/")
        self._inflight[self.router_url] = 0

    def pick(self, session_key: str | None = None) -> str:
        return self.router_url  # the router's cache-aware policy keeps a session together

    async def check_health(self) -> dict[str, bool]:
        status = await super().check_health()
        try:
            with anyio.fail_after(self.config.health_timeout_s):
                resp = await self._http.get(self.router_url + "/health")
            status[self.router_url] = resp.status_code == 200
        except (httpx.HTTPError, TimeoutError):
            status[self.router_url] = False
        return status


@contextlib.asynccontextmanager
async def running_router(
    cfg, urls: Sequence[str], log_dir: Path
) -> AsyncIterator[RouterServer | None]:
    """The router in front of ``urls`` when ``cfg.router`` (``EngineConfig``), else None;
    restarted if it crashes (up to ``max_restarts``), stopped on exit."""
    if not cfg.router:
        yield None
        return
    check_installed()
    from spade_async.engines import free_port

    router = RouterServer(
        urls,
        port=cfg.router_port or free_port(),
        host=cfg.host,
        policy=cfg.router_policy,
        log_path=str(log_dir / "router.log"),
        max_restarts=cfg.max_restarts,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(router.run)
        try:
            yield router
        finally:
            tg.cancel_scope.cancel()
