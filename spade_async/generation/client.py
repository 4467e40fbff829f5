"""The one generation client: token in, token out, over SGLang's native HTTP API.

Talks to SGLang servers (GPU) and to the project's CPU engine (``server.py``) alike.
Every request has a timeout; transport failures (refused, reset, timed out, 5xx) are
retried with exponential backoff, then raise one ``EngineError`` naming the URL. A 4xx
(e.g. a prompt longer than the context) raises ``EngineRequestError`` at once: the request
was bad, the engine is fine. A missing route (404/405) or a reply that is not the endpoint's
struct raises ``EngineProtocolError`` naming the route and the engine: it is not the
pinned SGLang API, and nothing retries that. Paths and structs: ``routes.py``. A ``CapacityLimiter`` bounds in-flight requests; routing picks
the least-loaded healthy engine, and ``session_key`` keeps a multi-turn episode on the
engine that already holds its prefix (SGLang's radix cache then reuses it).

    async with GenerationClient(["http://127.0.0.1:30000"]) as client:
        res = await client.generate(ids, SamplingParams(max_new_tokens=64, temperature=0.6))
        res.output_ids, res.logprobs, res.finish_reason, res.weight_version
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import anyio
import httpx
import msgspec

from spade_async.config import Doc
from spade_async.generation import routes
from spade_async.generation.engine_errors import (
    EngineError,
    EngineProtocolError,
    EngineRequestError,
    decode_reply,
    raise_all,
)
from spade_async.generation.light_http import send
from spade_async.generation.protocol import (
    ContinueGenerationReqInput,
    GenerateOutput,
    GenerateReqInput,
    MemoryOccupationReqInput,
    PauseGenerationReqInput,
    SamplingParams,
)
from spade_async.generation.routes import Endpoint
from spade_async.generation.sglang_source import PINNED
from spade_async.generation.weight_client import WeightRoutes

__all__ = [
    "request_priority",
    "ClientConfig",
    "GenerateResult",
    "EngineError",
    "EngineRequestError",
    "EngineProtocolError",
    "GenerationClient",
]


class ClientConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    request_timeout_s: Doc(float, "wall-clock limit for one HTTP request (a whole generation)") = (
        600.0
    )
    connect_timeout_s: Doc(float, "limit for opening a connection to an engine") = 5.0
    max_retries: Doc(int, "retries after a transport failure or 5xx before EngineError") = 3
    backoff_s: Doc(float, "first retry delay; doubles each retry") = 0.5
    backoff_max_s: Doc(float, "cap on one retry delay") = 8.0
    max_concurrency: Doc(int, "most requests in flight across all engines") = 256
    health_timeout_s: Doc(float, "limit for one /health probe") = 5.0
    max_sessions: Doc(int, "sticky session_key -> engine entries kept (oldest dropped)") = 100_000


class GenerateResult(msgspec.Struct, frozen=True, kw_only=True):
    output_ids: list[int]
    logprobs: list[float]  # per output token; see logprob_convention.py; [] if not requested
    finish_reason: str  # "stop" | "length" | "abort"
    matched: int | str | None  # the stop token id or stop string that ended generation
    text: str
    weight_version: str | None  # the weights of the last token (meta_info.weight_version)
    prompt_tokens: int
    url: str
    policy_version: str | None = None  # the oldest weights behind any token (meta_info spans)
    lora_path: str | None = None  # the adapter the request ran on (None: the base)
    adapter_version: int | None = None  # LoRA serving: the policy version of that adapter
    # routing replay (enable_routes): this request's routes, compact (routed_experts.py),
    # rows [routes_from, prompt + output - 1); None when the engine sent none. A reply whose
    # routes do not fit names the engine in routes_problem (the sample is dropped)
    routed_experts: bytes | None = None
    routes_problem: str = ""

    def policy(self, fallback: int) -> int:
        """The turn's policy version as the trainer counts them: under LoRA serving the
        version of the adapter the request ran on (``spade-v{N}`` -> N, the base 0: SGLang's
        ``weight_version`` stays the base's through adapter loads), else ``policy_version``,
        the oldest weights behind these tokens; ``fallback`` when the engine's is not a
        number."""
        if self.adapter_version is not None:
            return self.adapter_version
        version = self.policy_version if self.policy_version is not None else self.weight_version
        try:
            return int(version) if version is not None else fallback
        except ValueError:
            return fallback


_RETRY_STATUS = frozenset({500, 502, 503, 504})
# the ``priority`` of the generate requests a task sends (None: none), set per task tree
# with ``request_priority``: the async schedule marks each group's requests with the step
# the group is for, without threading it through every role's call
_PRIORITY: ContextVar[int | None] = ContextVar("spade_request_priority", default=None)


@contextlib.contextmanager
def request_priority(priority: int | None) -> Iterator[None]:
    """Generate requests sent inside (and by tasks started inside) carry ``priority``,
    which engines under priority scheduling serve in order (``engine.priority_scheduling``)."""
    token = _PRIORITY.set(priority)
    try:
        yield
    finally:
        _PRIORITY.reset(token)


_log = logging.getLogger(__name__)
_GEN_DECODER = msgspec.json.Decoder(GenerateOutput | list[GenerateOutput])


class GenerationClient(WeightRoutes):
    def __init__(self, urls: Sequence[str], config: ClientConfig | None = None) -> None:
        if not urls:
            raise EngineError("GenerationClient needs at least one engine URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.config = config or ClientConfig()
        self._limiter = anyio.CapacityLimiter(self.config.max_concurrency)
        self._inflight = dict.fromkeys(self.urls, 0)
        self._down: set[str] = set()
        self._held: set[str] = set()  # restarted engines kept out of rotation (hold/release)
        self._released = anyio.Event()
        self._sessions: OrderedDict[str, str] = OrderedDict()
        # LoRA serving (``use_adapters``): the adapter new requests run on (None: the base)
        # and the requests in flight per adapter (loop/lora.py unloads unused ones only)
        self.lora = False
        self.adapter: str | None = None
        self._adapter_inflight: dict[str | None, int] = {}
        self.route_shape = None  # routing replay (enable_routes): a RouteShape
        self._route_warned: set[str] = set()  # engines already warned about bad routes
        self._targets: dict[str, httpx.URL] = {}  # url + path, parsed once (not per request)
        # the newest weight version each engine reported (replies, model_info): an episode's
        # next turn asks for its routes from 0 when its engine's weights moved (engine_version)
        self.seen_versions: dict[str, str] = {}
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(
                self.config.request_timeout_s, connect=self.config.connect_timeout_s
            ),
            limits=httpx.Limits(max_connections=self.config.max_concurrency + 16),
        )

    async def __aenter__(self) -> GenerationClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---- routing ---------------------------------------------------------------------------
    def inflight(self) -> dict[str, int]:
        """Requests in flight per engine (for the dashboard)."""
        return dict(self._inflight)

    def hold(self, url: str) -> None:
        """Keep ``url`` out of rotation (a crashed engine restarting: it would serve start-up
        weights): no generation goes to it, retries included, until ``release``."""
        self._held.add(url.rstrip("/"))

    def release(self, url: str) -> None:
        """Back into rotation (its weight push has landed); wakes generations waiting on it."""
        self._held.discard(url.rstrip("/"))
        self._released.set()
        self._released = anyio.Event()

    def pick(self, session_key: str | None = None) -> str:
        """Least-loaded healthy engine; the same one for a session while it stays healthy.
        Held engines are never picked (``generate`` waits while every engine is held)."""
        if session_key is not None:
            url = self._sessions.get(session_key)
            if url is not None and url not in self._down and url not in self._held:
                self._sessions.move_to_end(session_key)
                return url
        serving = [u for u in self.urls if u not in self._held]
        if not serving:
            raise _Held("every engine is held")
        healthy = [u for u in serving if u not in self._down] or serving
        url = min(healthy, key=lambda u: self._inflight[u])
        if session_key is not None:
            self._sessions[session_key] = url
            if len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)
        return url

    def end_session(self, session_key: str) -> None:
        self._sessions.pop(session_key, None)

    def saw_version(self, url: str, version: str) -> None:
        """Record ``url``'s weight version; a late reply of older weights does not go back."""
        old = self.seen_versions.get(url)
        if old is not None and old.isdigit() and version.isdigit() and int(version) < int(old):
            return
        self.seen_versions[url] = version

    def engine_version(self, session_key: str | None) -> str | None:
        """The last weight version seen from the engine a session is pinned to; unpinned
        (behind sglang-router, which keeps sessions itself, and updates every engine), the
        newest seen anywhere; None when nothing was seen (``roles/episode_routes.py``)."""
        url = self._sessions.get(session_key) if session_key is not None else None
        if url is not None:
            return self.seen_versions.get(url)
        seen = list(self.seen_versions.values())
        if seen and all(v.isdigit() for v in seen):
            return max(seen, key=int)
        return seen[-1] if seen else None

    # ---- LoRA adapters -----------------------------------------------------------------------
    def use_adapters(self, adapter: str | None = None) -> None:
        """Serve through adapters from now on: every request names ``adapter`` (None: the
        base, policy version 0) until ``set_adapter``; results carry that adapter's version."""
        self.lora, self.adapter = True, adapter

    def set_adapter(self, name: str | None) -> None:
        """Requests sent from now on run on adapter ``name`` (loaded on every engine); those
        already sent keep theirs (SGLang pins a request's adapter)."""
        self.adapter = name

    def adapter_load(self) -> dict[str | None, int]:
        """Requests in flight (retries and waits included) per adapter name."""
        return {k: v for k, v in self._adapter_inflight.items() if v}

    async def unload_adapter(self, name: str, urls: Sequence[str]) -> None:
        """SGLang ``/unload_lora_adapter`` of ``name`` on ``urls``; a refusal is EngineError."""
        from spade_async.generation.lora import UnloadLoRAAdapterReqInput

        req = UnloadLoRAAdapterReqInput(lora_name=name)
        await self._fan_out([(url, routes.UNLOAD_LORA, req) for url in urls])

    def enable_routes(self, shape) -> None:
        """Routing replay: every request that returns log-probs also asks for its MoE routes
        (``shape``: the model's ``RouteShape``; engines run --enable-return-routed-experts)."""
        self.route_shape = shape

    # ---- generation ------------------------------------------------------------------------
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        return_logprob: bool = True,
        session_key: str | None = None,
        routes_from: int = 0,
    ) -> GenerateResult:
        """One completion for one prompt (``sampling.n`` must be 1; see ``generate_n``)."""
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ValueError(f"generate() takes n=1, got n={sampling.n}; use generate_n()")
        return (
            await self.generate_n(
                input_ids,
                sampling,
                return_logprob=return_logprob,
                session_key=session_key,
                routes_from=routes_from,
            )
        )[0]

    async def generate_n(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        return_logprob: bool = True,
        session_key: str | None = None,
        routes_from: int = 0,
    ) -> list[GenerateResult]:
        """``sampling.n`` completions of one prompt, in sample order. Under LoRA serving the
        request runs on the current adapter, chosen once: its retries keep it. With routes
        enabled (``enable_routes``) a request with log-probs asks for the routes of positions
        ``routes_from`` on (SGLang's ``routed_experts_start_len``: a later turn of an episode
        asks only for what it adds)."""
        if sampling.n > 1 and sampling.sampling_seed is not None:
            return await self._seeded_n(
                input_ids, sampling, return_logprob, session_key, routes_from
            )
        want_routes = self.route_shape is not None and return_logprob
        async with self._limiter:
            adapter = self.adapter if self.lora else None
            req = GenerateReqInput(
                input_ids=list(input_ids),
                sampling_params=sampling,
                return_logprob=return_logprob,
                lora_path=adapter,
                priority=_PRIORITY.get(),
                return_routed_experts=want_routes,
                routed_experts_start_len=routes_from if want_routes else 0,
            )
            self._adapter_inflight[adapter] = self._adapter_inflight.get(adapter, 0) + 1
            try:
                body, url = await self._generate_on_some_engine(req, session_key)
            finally:
                self._adapter_inflight[adapter] -= 1
        outs = decode_reply(_GEN_DECODER, body, url, routes.GENERATE)
        outs = outs if isinstance(outs, list) else [outs]
        version = _adapter_version(adapter) if self.lora else None
        results = [_result(o, url, lora_path=adapter, adapter_version=version) for o in outs]
        if results and results[-1].weight_version is not None:
            self.saw_version(url, results[-1].weight_version)
        if want_routes:  # base64 of up to tokens x layers x top-k ids: off the event loop
            sent = len(req.input_ids)  # the rows follow the prompt we sent, not the engine's count
            results = await anyio.to_thread.run_sync(
                self._all_routes, results, outs, routes_from, sent
            )
        return results

    async def _seeded_n(self, input_ids, sampling, return_logprob, session_key, routes_from):
        """A seeded ``n > 1`` request as ``n`` requests with seeds ``seed + i`` (the CPU
        engine's own expansion of ``n``): SGLang samples from (seed, position) alone, so its
        ``n`` copies of one seeded request would all draw the same tokens (seeds.py)."""
        results: list = [None] * sampling.n

        async def one(i: int) -> None:
            single = msgspec.structs.replace(
                sampling, n=1, sampling_seed=sampling.sampling_seed + i
            )
            results[i] = (
                await self.generate_n(
                    input_ids, single, return_logprob=return_logprob,
                    session_key=session_key, routes_from=routes_from,
                )
            )[0]  # fmt: skip

        async with anyio.create_task_group() as tg:
            for i in range(sampling.n):
                tg.start_soon(one, i)
        return results

    def _all_routes(self, results, outs, start: int, sent: int) -> list[GenerateResult]:
        return [self._with_routes(r, o, start, sent) for r, o in zip(results, outs, strict=True)]

    def _with_routes(
        self, res: GenerateResult, out: GenerateOutput, start: int, sent: int
    ) -> GenerateResult:
        """``res`` with its routes decoded and checked against the model's shape and the
        token count: the ``sent`` prompt tokens plus the tokens generated, never the prompt
        length the engine reports (a misfit, or an engine that miscounts the prompt:
        ``routes_problem``, one warning per engine)."""
        from spade_async.generation.routed_experts import RouteError, decode_sglang

        text = out.meta_info.routed_experts
        if text is None:
            return res
        rows = max(0, sent + len(res.output_ids) - 1 - start)
        try:
            if res.prompt_tokens != sent:
                raise RouteError(
                    f"reports {res.prompt_tokens} prompt tokens; the client sent {sent}"
                )
            return msgspec.structs.replace(
                res, routed_experts=decode_sglang(text, self.route_shape, rows)
            )
        except RouteError as exc:
            problem = f"engine {res.url}: {exc}"
            if res.url not in self._route_warned:
                self._route_warned.add(res.url)
                _log.warning("routing replay: %s; its samples are dropped", problem)
            return msgspec.structs.replace(res, routes_problem=problem)

    async def _generate_on_some_engine(
        self, req: GenerateReqInput, session_key: str | None
    ) -> tuple[bytes, str]:
        while True:
            if self._held.issuperset(self.urls):  # every engine restarting: wait for one
                await self._released.wait()
                continue
            url = self.pick(session_key)
            self._inflight[url] += 1
            try:
                return await self._call(url, routes.GENERATE, req), url
            except _Held:  # its engine crashed and is held: another one (or wait)
                continue
            finally:
                self._inflight[url] -= 1

    # ---- control ---------------------------------------------------------------------------
    async def check_health(self) -> dict[str, bool]:
        """Probe every engine's /health once; unhealthy ones get no new sessions."""
        status: dict[str, bool] = {}

        async def probe(url: str) -> None:
            try:
                with anyio.fail_after(self.config.health_timeout_s):
                    resp = await self._http.get(url + routes.HEALTH.path)
                status[url] = resp.status_code == 200
            except (httpx.HTTPError, TimeoutError):
                status[url] = False

        async with anyio.create_task_group() as tg:
            for url in self.urls:
                tg.start_soon(probe, url)
        self._down = {u for u, ok in status.items() if not ok}
        return status

    async def wait_healthy(self, timeout_s: float, *, poll_s: float = 0.5) -> None:
        with anyio.move_on_after(timeout_s):
            while True:
                if all((await self.check_health()).values()):
                    return
                await anyio.sleep(poll_s)
        raise EngineError(
            f"engines not healthy after {timeout_s:.0f} s: {', '.join(sorted(self._down))}"
        )

    async def pause(self, mode: str = "abort") -> None:
        """SGLang ``/pause_generation``; only ``retract`` and ``abort`` let a flush follow."""
        await self._all(routes.PAUSE, PauseGenerationReqInput(mode=mode))

    async def resume(self) -> None:
        await self._all(routes.CONTINUE, ContinueGenerationReqInput())

    async def release_memory(self, tags: list[str] | None = None) -> None:
        """SGLang ``/release_memory_occupation`` on every engine (``None``: every tag of
        ``sglang_state.MEMORY_TAGS``). Colocated training frees the GPUs this way; engines
        must be idle (SGLang's scheduler asserts it and dies otherwise)."""
        await self._all(routes.RELEASE_MEMORY, MemoryOccupationReqInput(tags=tags))

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """SGLang ``/resume_memory_occupation`` (``None``: every tag, released or not: a tag
        not released kills SGLang's scheduler, KeyError; name the tags you released)."""
        await self._all(routes.RESUME_MEMORY, MemoryOccupationReqInput(tags=tags))

    async def flush_cache(self) -> None:
        """Drop every engine's prefix (radix) cache; SGLang refuses (HTTP 400) while requests
        run, so call it idle or paused with ``retract``/``abort``."""
        await self._all(routes.FLUSH_CACHE, None)

    # ---- plumbing --------------------------------------------------------------------------
    async def _fan_out(self, calls: list[tuple[str, Endpoint, Any]]) -> None:
        """Send every call concurrently; all failures become one EngineError."""
        errors: list[EngineError] = []

        async def one(url: str, ep: Endpoint, req: Any) -> None:
            try:
                body = await self._call(url, ep, req)
                if ep.reply is not None:
                    out = decode_reply(msgspec.json.Decoder(ep.reply), body, url, ep)
                    if not out.success:
                        errors.append(EngineError(f"engine {url}{ep.path} failed: {out.message}"))
            except EngineError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(one, *call)
        raise_all(errors)

    async def _all(self, ep: Endpoint, payload: Any) -> None:
        await self._fan_out([(url, ep, payload) for url in self.urls])

    async def _call(self, url: str, ep: Endpoint, req: msgspec.Struct | None) -> bytes:
        """One request of the endpoint table: its method and path, the body encoded from
        its struct (``req`` must be one of ``ep.request``)."""
        if req is not None and not isinstance(req, ep.request):
            raise TypeError(f"{ep.path} takes {ep.request.__name__}, got {type(req).__name__}")
        data = None if req is None else msgspec.json.encode(req)
        return await self._request(ep.method, url, ep.path, data)

    async def _request(self, method: str, url: str, path: str, data: bytes | None) -> bytes:
        cfg, last = self.config, ""
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                await anyio.sleep(min(cfg.backoff_s * 2 ** (attempt - 1), cfg.backoff_max_s))
            if url in self._held and path == routes.GENERATE.path:
                raise _Held(url)  # never generate on a held engine, not even as a retry
            try:
                with anyio.fail_after(cfg.request_timeout_s):  # light_http: past httpx's layers
                    resp = await send(self._http, method, self._target(url, path), data)
            except TimeoutError:
                last = f"no reply within {cfg.request_timeout_s:.0f} s"
                continue
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code in (404, 405):
                raise EngineProtocolError(
                    f"engine {url} does not serve {method} {path} (HTTP {resp.status_code}); "
                    f"the project speaks SGLang {PINNED}'s API: run that release or the CPU engine"
                )
            if resp.status_code >= 400:
                raise EngineRequestError(f"engine {url}{path}: {_message(resp)}")
            self._down.discard(url)
            return resp.content
        self._down.add(url)
        raise EngineError(
            f"engine {url}{path} failed after {cfg.max_retries + 1} attempts ({last}); "
            "is the server running and healthy?"
        )

    def _target(self, url: str, path: str) -> httpx.URL:
        """``url + path`` as httpx's URL, parsed once: a str is parsed again per request."""
        key = url + path
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) > 1024:  # engines come and go: keep it bounded
                self._targets.clear()
            target = self._targets[key] = httpx.URL(key)
        return target


class _Held(Exception):
    """A generation reached an engine held out of rotation; ``generate_n`` picks again."""


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:
            return str(body["message"])
        if body.get("error_message"):  # LoRAUpdateOutput (the LoRA routes)
            return str(body["error_message"])
    return f"HTTP {resp.status_code}: {str(body)[:300]}"


def _adapter_version(name: str | None) -> int:
    from spade_async.generation.lora import adapter_version

    return 0 if name is None else adapter_version(name)


def _result(
    out: GenerateOutput, url: str, *, lora_path: str | None = None, adapter_version=None
) -> GenerateResult:
    meta = out.meta_info
    finish = meta.finish_reason
    lps = meta.output_token_logprobs or []
    return GenerateResult(
        output_ids=list(out.output_ids),
        logprobs=[lp[0] for lp in lps],  # floats: protocol.MetaInfo declares them
        finish_reason=finish.type if finish is not None else "abort",
        matched=finish.matched if finish is not None else None,
        text=out.text,
        weight_version=meta.weight_version,
        policy_version=meta.oldest_version(),
        prompt_tokens=meta.prompt_tokens,
        url=url,
        lora_path=lora_path,
        adapter_version=adapter_version,
    )
