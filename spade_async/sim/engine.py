"""Simulated generation engines behind the project's own generation client.

``SimClient`` is ``GenerationClient`` with its httpx client on a mock transport answered
here: the controller's client picks engines, keeps sessions sticky, limits concurrency,
retries, times out, encodes requests and decodes replies as it does against SGLang. Each ``SimEngine`` is one
server doing continuous batching in virtual time: requests wait in a queue (priority order
under ``engine.priority_scheduling``, else arrival), are admitted while the KV cache holds
their context and reply and ``engine.max_running_requests`` allows, prefill, then decode one
token per iteration, an iteration costing ``iter_fixed + B x iter_per_seq + context x
iter_per_ctx`` (``costs.Costs``). Between arrivals and completions the engine sleeps the
exact time to the next completion, so a step costs two events per request, not one per
token. Reply lengths are drawn per role (the first prompt token is the role's tag, see
``parts.SimTokenizer``) from ``costs.Lengths``; a draw past ``max_new_tokens`` ends ``length``.
"""

from __future__ import annotations

import heapq
import itertools
import time
from contextvars import ContextVar
from functools import lru_cache

import anyio
import httpx
import msgspec
import numpy as np

from spade_async.generation.client import GenerationClient
from spade_async.generation.protocol import SamplingParams
from spade_async.sim.costs import Costs, lognormal

__all__ = [
    "SimEngine",
    "SimClient",
    "ROLE_AGENT",
    "ROLE_HINT",
    "ROLE_DESIGNER",
    "GAMES_REPLY",
    "TOOL_REPLY",
    "SOLUTION",
]

ROLE_AGENT, ROLE_HINT, ROLE_DESIGNER = 1, 2, 3
# the policy's reply to every turn (an environment judges it at random, its own win rate);
# an audit's garbage is these made absurd (envs/audit.absurd: the number, the boxed word)
GAMES_REPLY = "\\boxed{a}"
TOOL_REPLY = '<tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call>'
SOLUTION = "\\boxed{zz-solution}"
EOS = 2


class _Req(msgspec.Struct, frozen=False):
    """What the engine needs of a request; ``input_ids`` stays undecoded (length only)."""

    input_ids: msgspec.Raw
    sampling_params: SamplingParams
    priority: int | None = None


_REQ = msgspec.json.Decoder(_Req)
# CPU seconds the simulated engines spent (scheduling, encoding replies): not the controller's
SIM_CPU = [0.0]
_SESSION: ContextVar[str | None] = ContextVar("sim_session", default=None)


class _Run:
    __slots__ = ("prefill", "ctx", "left", "out", "cut", "order", "done", "v0", "role")

    def __init__(self, prefill, ctx, out, cut, order, role):
        self.prefill, self.ctx, self.left, self.out, self.cut = prefill, ctx, out, out, cut
        self.order, self.done, self.v0, self.role = order, anyio.Event(), 0, role


@lru_cache(maxsize=4096)
def _ids_json(n: int, tail_eos: bool) -> str:
    ids = ["7"] * n
    if tail_eos and n:
        ids[-1] = str(EOS)
    return "[" + ",".join(ids) + "]"


@lru_cache(maxsize=4096)
def _lps_json(n: int) -> str:
    return "[" + ",".join(["[-0.5,7,null]"] * n) + "]"


class SimEngine:
    def __init__(self, url: str, costs: Costs, *, max_running: int, priority: bool) -> None:
        self.url, self.c = url, costs
        self.max_running = max_running or 1024
        self.priority = priority
        self.queue: list = []
        self.running: list[_Run] = []
        self.version = 0
        self.busy_s = 0.0
        self.decoded = 0
        self.batch_s = 0.0  # running sequences x seconds (mean batch = batch_s / busy_s)
        self.held = 0  # > 0: paused (a push) or the GPUs lent to the trainer (colocated)
        self._wake = anyio.Event()
        self._seq = itertools.count()
        self._pending_prefill_s = 0.0
        self.cache: dict[str, int] = {}  # session -> tokens of its prefix in the KV cache

    def submit(self, run: _Run, priority: int | None) -> None:
        key = (priority if (self.priority and priority is not None) else 0, next(self._seq))
        heapq.heappush(self.queue, (key, run))
        self._wake.set()

    def hold(self) -> None:
        self.held += 1
        self._wake.set()

    def release(self, flush: bool = False) -> None:
        """End a hold; ``flush``: the KV cache was dropped, running requests prefill again."""
        self.held -= 1
        if flush:
            self.cache.clear()
            for r in self.running:
                r.prefill = r.ctx
            self._pending_prefill_s += sum(r.ctx for r in self.running) * self.c.prefill_per_token_s
        self._wake.set()

    def _admit(self) -> None:
        used = sum(r.ctx + r.left for r in self.running)
        while self.queue and len(self.running) < self.max_running:
            run = self.queue[0][1]
            if self.running and used + run.ctx + run.left > self.c.kv_capacity_tokens:
                break
            heapq.heappop(self.queue)
            run.v0 = self.version
            used += run.ctx + run.left
            self._pending_prefill_s += run.prefill * self.c.prefill_per_token_s
            self.running.append(run)

    async def run(self) -> None:
        """The engine's task; all of its CPU, its waits' too, is the engine's (``_Timed``)."""
        await _Timed(self._loop())

    async def _loop(self) -> None:
        c = self.c
        while True:
            if self.held or not (self.running or self.queue):
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            self._admit()
            b = len(self.running)
            k = min(r.left for r in self.running)
            ctx = sum(r.ctx for r in self.running) + b * k / 2
            t_iter = c.iter_fixed_s + b * c.iter_per_seq_s + ctx * c.iter_per_ctx_s
            prefill = self._pending_prefill_s
            due = prefill + k * t_iter
            self._wake = anyio.Event()
            t0 = anyio.current_time()
            with anyio.move_on_after(due):
                await self._wake.wait()
            spent = anyio.current_time() - t0
            self.busy_s += spent
            self.batch_s += b * spent
            if spent >= due - 1e-9:
                n = k
            else:
                n = min(k, max(0, int((spent - prefill) / t_iter))) if spent > prefill else 0
            self._pending_prefill_s = max(0.0, prefill - spent)
            if n == 0:
                continue
            self.decoded += n * b
            still = []
            for r in self.running:
                r.left -= n
                r.ctx += n
                if r.left <= 0:
                    r.done.set()
                else:
                    still.append(r)
            self.running = still


class _Timed:
    """Awaits a coroutine step by step, adding the CPU of each step (what it runs between
    two suspensions, entering and leaving its cancel scopes and waits included) to
    ``SIM_CPU``: a simulated engine's task is the engine's, none of it the controller's.
    Every value, exception and cancellation passes through unchanged."""

    __slots__ = ("coro",)

    def __init__(self, coro) -> None:
        self.coro = coro

    def __await__(self):
        coro, value, error = self.coro, None, None
        while True:
            c0 = time.process_time()
            try:
                out = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                SIM_CPU[0] += time.process_time() - c0
            try:
                value, error = (yield out), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - cancellation goes in, as await does
                value, error = None, exc


class SimClient(GenerationClient):
    """The controller's generation client over ``SimEngine``s (see the module docstring)."""

    def __init__(self, engines: list[SimEngine], config, cfg, rng: np.random.Generator) -> None:
        super().__init__([e.url for e in engines], config)
        self.engines = {e.url: e for e in engines}
        # the client's own HTTP layer (its retries, timeouts, statuses) reaches the engines
        # through httpx's mock transport, as the tests' fake SGLang does
        self._http = httpx.AsyncClient(transport=httpx.MockTransport(self._serve))
        self.cfg, self.rng, self.lengths = cfg, rng, engines[0].c.lengths
        tool = cfg.designer.setting == "tool_use" or getattr(cfg, "_sim_tool_use", False)
        self.turn_text = TOOL_REPLY if tool else GAMES_REPLY
        self._ids = itertools.count()

    def _draw(self, role: int, cap: int) -> tuple[int, bool]:
        ln = self.lengths
        median, sigma = {
            ROLE_AGENT: (ln.agent_reply_median, ln.agent_reply_sigma),
            ROLE_HINT: (ln.hint_reply_median, ln.hint_reply_sigma),
        }.get(role, (ln.designer_reply_median, ln.designer_reply_sigma))
        return lognormal(self.rng, median, sigma, cap)

    def _text(self, role: int) -> str:
        if role == ROLE_AGENT:
            return self.turn_text
        if role == ROLE_HINT:
            return "Think about the corners first."
        n = next(self._ids)  # a distinct environment each time (memory dedups equal code)
        return f"```python\nclass SimEnv{n}:\n    uid = {n}  # {self.rng.integers(1 << 62)}\n```"

    async def _generate_on_some_engine(self, req, session_key):
        token = _SESSION.set(session_key)
        try:
            return await super()._generate_on_some_engine(req, session_key)
        finally:
            _SESSION.reset(token)

    def end_session(self, session_key: str) -> None:
        super().end_session(session_key)
        for e in self.engines.values():
            e.cache.pop(session_key, None)

    async def _serve(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/generate":  # /health, pause, resume, memory: always fine
            return httpx.Response(200, json={"success": True, "message": ""})
        url = f"{request.url.scheme}://{request.url.host}"
        return httpx.Response(200, content=await self._generate(url, request.content))

    async def _generate(self, url: str, data: bytes) -> bytes:
        c0 = time.process_time()
        eng = self.engines[url]
        req = _REQ.decode(data)
        raw = bytes(req.input_ids)
        n_in = raw.count(b",") + 1
        role = int(raw[1 : raw.index(b",")]) if n_in > 1 else ROLE_AGENT
        if role == ROLE_DESIGNER:  # the simulator has no corpus: the prompt's real size
            n_in = max(n_in, self.lengths.designer_prompt_tokens)
        sp = req.sampling_params
        session = _SESSION.get()
        cached = eng.cache.get(session, 0) if session else 0  # the radix cache's prefix
        outs = []
        for _ in range(max(1, sp.n)):
            out, cut = self._draw(role, sp.max_new_tokens)
            run = _Run(max(1, n_in - cached), n_in, out, cut, 0, role)
            eng.submit(run, req.priority)
            outs.append(run)
        SIM_CPU[0] += time.process_time() - c0
        for run in outs:
            await run.done.wait()
        c0 = time.process_time()
        if session:
            eng.cache[session] = n_in + outs[0].out
        body = self._encode(outs, eng, n_in)
        SIM_CPU[0] += time.process_time() - c0
        return body

    def _encode(self, outs: list[_Run], eng: SimEngine, n_in: int) -> bytes:
        parts = []
        for r in outs:
            finish = '{"type":"length"}' if r.cut else f'{{"type":"stop","matched":{EOS}}}'
            spans = ""
            if r.v0 != eng.version:
                spans = f',"weight_versions":[{{"version":"{r.v0}","start":0,"end":{r.out}}}]'
            parts.append(
                f'{{"text":{msgspec.json.encode(self._text(r.role)).decode()},'
                f'"output_ids":{_ids_json(r.out, not r.cut)},"meta_info":{{"id":"s",'
                f'"prompt_tokens":{n_in},"completion_tokens":{r.out},"finish_reason":{finish},'
                f'"weight_version":"{eng.version}"{spans},'
                f'"output_token_logprobs":{_lps_json(r.out)}}}}}'
            )
        body = parts[0] if len(parts) == 1 else "[" + ",".join(parts) + "]"
        return body.encode()
