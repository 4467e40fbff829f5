"""CPU generation engine speaking the subset of SGLang's native HTTP API the project uses.

    python -m spade_async.generation.server --model smollm2-135m-instruct --port 30000

Serves exactly the endpoint table of ``routes.py`` (same paths, methods and body structs as
SGLang 0.5.23; ``tests/contract`` checks it against SGLang's source): ``POST /generate``
(``input_ids`` one prompt or a batch, ``text`` too; ``sampling_params`` one dict or one per
prompt; ``return_logprob``, ``return_text_in_logprobs``, ``rid``), ``GET /health``,
``GET /model_info`` (``weight_version``), ``POST /flush_cache``,
``POST /update_weights_from_disk``, ``POST /pause_generation`` (``mode``: ``abort`` default
as in SGLang; ``in_place`` and ``retract`` both keep requests and resume them),
``POST /continue_generation``, ``POST /release_memory_occupation`` and
``POST /resume_memory_occupation`` (``tags``: ``kv_cache``, ``weights``, ``cuda_graph``,
or null for all), ``POST /begin_weight_update`` / ``/end_weight_update`` and
``/destroy_weights_update_group``. The control routes keep SGLang 0.5.23's state machine
(``sglang_state.py``, each rule citing the wheel function it models; ``tests/contract``
runs SGLang's own scheduler-side code against it): pushes over NCCL/IPC are refused outside
a weight-update session, a resume of a tag not released kills the engine as SGLang's
scheduler dies (every later call 503, the process exits and its supervisor restarts it), a
release with requests in the running batch too, a flush after an update is refused (and
the update reported failed, ``/model_info`` keeping the old version) while an ``in_place``
pause keeps requests running; weights resume with undefined contents until the next
update, as SGLang without a CPU backup; ``/generate`` answers 409 while released.
``SPADE_ENGINE_TRACE=DIR`` writes every judged call as a JSON line (the loop tests'
recorder). ``/health`` is liveness (200 while paused), as the launcher runs SGLang. Errors
are HTTP 400 with SGLang's body ``{"error": {"message": ...}}``; a bad prompt fails only its
own request. Like SGLang, ``meta_info`` carries ``weight_version`` (the weights of the last
token) and ``weight_versions`` (``[{version, start, end}]`` spans of output tokens, more than
one when a weight update landed while the request ran paused ``in_place``).

Not implemented here (GPU-only paths; HTTP 400 saying so): ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/update_weights_from_tensor``, ``stream``,
``top_logprobs_num``, input-token log-probs (``logprob_start_len`` >= 0). The prefix cache
is the engine's ``PrefixCache`` (finished requests' KV, reused by the next turn of their
conversation; ``--disable-radix-cache`` turns it off): ``/flush_cache``, when SGLang's state
allows it, drops it on every engine (base and adapters), and so does any weight change.

Responses: ``output_ids`` include the token that stopped generation (EOS or a stop token
id) so the trainer sees every sampled token with its log-prob; ``text`` is decoded with
``skip_special_tokens`` and cut before a matched stop string unless ``no_stop_trim``.
With ``n > 1`` a prompt yields ``n`` results, prompt-major (``p0s0, p0s1, ..., p1s0``);
sample ``i`` uses seed ``sampling_seed + i``. Log-probs: see ``logprob_convention.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import uuid
from typing import Any

import msgspec
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from spade_async.generation import routes
from spade_async.generation.control import ControlRoutes, _error, _json, _tracer
from spade_async.generation.engine import (
    PREFIX_CACHE_BYTES,
    Engine,
    EngineBusy,
    Sequence,
    now_seed,
)
from spade_async.generation.priority import PriorityPolicy, PriorityRefused
from spade_async.generation.protocol import (
    BadRequest,
    GenerateOutput,
    GenerateReqInput,
    MetaInfo,
    SamplingParams,
    WeightVersionSpan,
)
from spade_async.generation.seeds import request_seed
from spade_async.generation.sglang_state import SGLangState

__all__ = ["EngineApp", "build_app", "make_engine_app", "serve_in_thread", "main"]


class RoutedGenerateReqInput(GenerateReqInput, kw_only=True):
    """``/generate`` as the CPU engine decodes it: SGLang's body plus the OpenAI-style
    ``model`` that sglang-router adds when it forwards a request (SGLang's HTTP layer drops
    it before its ``GenerateReqInput``; the contract checks what the client sends)."""

    model: str | None = None


class EngineApp(ControlRoutes):
    """HTTP handlers around one ``Engine``: ``/generate`` here, the control routes (pause,
    weight updates, memory) in ``control.py``."""

    def __init__(self, engine: Engine, *, model_path: str, context_length: int, dtype: str) -> None:
        self.engine, self.model_path, self.context_length = engine, model_path, context_length
        self.dtype = dtype
        self.vocab_size = int(engine.model.config.vocab_size)
        self._update_lock = asyncio.Lock()
        self._spare: Any = None  # a second model the next weight update is copied into
        self._decode_gen = msgspec.json.Decoder(RoutedGenerateReqInput)
        # SGLang's control-plane state; its running batch is the engine's (only the rows
        # already decoding while paused; every request while not)
        self.sgl = SGLangState(
            engine.weight_version,
            running=lambda: len(engine.active) if self.sgl.paused else engine.load(),
        )
        self.on_fatal: Any = None  # what a fatal call does beyond refusing all later ones
        self.sgl.on_call = _tracer()
        from spade_async.generation.lora import LoraServing

        self.lora = LoraServing(self, enabled=False)  # --enable-lora (generation/lora.py)
        self.priority = engine.priority  # --enable-priority-scheduling and its flags
        self.deterministic = False  # --deterministic: an unseeded request's seed from its prompt

    # ---- /generate -------------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = self._decode_gen.decode(await request.body())
            prompts, params, rids, single = self._normalise(req)
            priority = self.priority.resolve(req.priority)
            engines = self._engines(req.lora_path, len(prompts))
            seqs = [
                self._sequences(p, sp, rid, priority)
                for p, sp, rid in zip(prompts, params, rids, strict=True)
            ]
            self._want_routes(req, prompts, seqs)
        except (msgspec.ValidationError, msgspec.DecodeError, BadRequest) as exc:
            return _error(str(exc))
        except PriorityRefused as exc:
            return _error(str(exc), status=503)
        flat = [s for group in seqs for s in group]
        try:  # no await between picking an adapter's engine and submitting to it (unload waits)
            for engine, group in zip(engines, seqs, strict=True):
                engine.submit(group)
        except EngineBusy as exc:
            return _error(str(exc), status=409)
        try:
            done = await asyncio.gather(*(asyncio.wrap_future(s.future) for s in flat))
        except Exception as exc:  # a failed model step: report it, keep serving
            return _error(f"generation failed: {type(exc).__name__}: {exc}", status=500)
        outs = [self._output(s, req) for s in done]
        return _json(outs[0] if single and len(outs) == 1 else outs)

    def _want_routes(self, req: GenerateReqInput, prompts, seqs) -> None:
        """SGLang's scheduler rule for ``routed_experts_start_len`` (refused below 0 or above
        the prompt's length, whether or not the server captures routes); the routes come
        back only with ``--enable-return-routed-experts``."""
        if not req.return_routed_experts:
            return
        start = req.routed_experts_start_len
        for prompt, group in zip(prompts, seqs, strict=True):
            if start < 0:
                raise BadRequest(
                    f"routed_experts_start_len={start} is lower than 0. Please use a non-negative "
                    "routed_experts_start_len."
                )
            if start > len(prompt):
                raise BadRequest(
                    f"routed_experts_start_len={start} is higher than the number of input tokens "
                    f"{len(prompt)}. "
                    "Please use a smaller routed_experts_start_len."
                )
            for seq in group:  # adapter engines capture too (lora.py builds them alike)
                seq.want_routes, seq.route_start = self.engine.routed_experts, start

    def _engines(self, lora_path, n: int) -> list:
        """The engine of each prompt: the base, or the adapter its ``lora_path`` names."""
        names = lora_path if isinstance(lora_path, list) else [lora_path] * n
        if len(names) != n:
            raise BadRequest(f"{len(names)} lora_path entries for {n} prompts")
        if not any(names):
            return [self.engine] * n
        path = "/generate"  # requests on adapters go into the call log (lora.record)
        if not self.lora.enabled:
            message = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
            self.lora.record(path, ok=False, message=message)
            raise BadRequest(message)
        try:
            engines = [self.engine if not name else self.lora.engine_for(name) for name in names]
        except KeyError as exc:
            self.lora.record(path, ok=False, message=exc.args[0])
            raise BadRequest(exc.args[0]) from None
        self.lora.record(path, ok=True, message="lora_path=" + ",".join(map(str, names)))
        return engines

    def _normalise(self, req: GenerateReqInput):
        if req.stream:
            raise BadRequest("stream=true is not supported by the CPU engine; send stream=false")
        for name in ("return_hidden_states", "return_entropy", "return_bytes", "background"):
            if getattr(req, name):
                raise BadRequest(f"{name}=true is not supported by the CPU engine; send false")
        if req.top_logprobs_num:
            raise BadRequest("top_logprobs_num is not supported by the CPU engine; send 0")
        if req.return_logprob and req.logprob_start_len not in (-1,):
            raise BadRequest(
                "input-token log-probs (logprob_start_len >= 0) are not supported by the CPU engine"
            )
        if (req.input_ids is None) == (req.text is None):
            raise BadRequest("give exactly one of input_ids or text")
        if req.input_ids is not None:
            ids = req.input_ids
            if ids and all(isinstance(x, list) for x in ids):
                prompts, single = [list(x) for x in ids], False
            elif all(isinstance(x, int) for x in ids):
                prompts, single = [list(ids)], True
            else:
                raise BadRequest("input_ids must be a list of ints or a list of lists of ints")
        else:
            texts = [req.text] if isinstance(req.text, str) else list(req.text)
            single = isinstance(req.text, str)
            prompts = [self.engine.tokenizer(t).input_ids for t in texts]
        sp = req.sampling_params or SamplingParams()
        params = list(sp) if isinstance(sp, list) else [sp] * len(prompts)
        if len(params) != len(prompts):
            raise BadRequest(f"{len(params)} sampling_params for {len(prompts)} prompts")
        rids = req.rid if isinstance(req.rid, list) else [req.rid] * len(prompts)
        if len(rids) != len(prompts):
            raise BadRequest(f"{len(rids)} rids for {len(prompts)} prompts")
        return prompts, params, rids, single

    def _sequences(
        self, prompt: list[int], sp: SamplingParams, rid: str | None, priority: int = 0
    ) -> list[Sequence]:
        n_prompt = len(prompt)
        if n_prompt == 0:
            raise BadRequest("empty prompt: input_ids has no tokens")
        if n_prompt >= self.context_length:
            raise BadRequest(
                f"prompt has {n_prompt} tokens but the context length is {self.context_length}; "
                "shorten the prompt"
            )
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if sp.n < 1 or sp.max_new_tokens < 1 or sp.temperature < 0 or not 0 < sp.top_p <= 1:
            raise BadRequest(
                f"bad sampling_params: n={sp.n}, max_new_tokens={sp.max_new_tokens}, "
                f"temperature={sp.temperature}, top_p={sp.top_p} (need n>=1, max_new_tokens>=1, "
                "temperature>=0, 0<top_p<=1)"
            )
        stop_ids = set(sp.stop_token_ids or ())
        if not sp.ignore_eos:
            stop_ids |= self.engine.eos_ids
        max_new = min(sp.max_new_tokens, self.context_length - n_prompt)
        base = sp.sampling_seed
        if base is None:
            base = request_seed("unseeded", prompt) if self.deterministic else now_seed()
        rid = rid or uuid.uuid4().hex
        seqs = []
        for i in range(sp.n):
            gen = torch.Generator().manual_seed(base + i)
            seqs.append(
                Sequence(
                    rid=rid if sp.n == 1 else f"{rid}-{i}",
                    prompt_ids=prompt,
                    params=sp,
                    max_new=max_new,
                    stop_ids=frozenset(stop_ids),
                    generator=gen,
                    priority=priority,
                )
            )
        return seqs

    def _output(self, seq: Sequence, req: GenerateReqInput) -> GenerateOutput:
        tok = self.engine.tokenizer
        ids = seq.output_ids
        finish = seq.finish
        text_ids = ids
        if finish is not None and finish.type == "stop" and isinstance(finish.matched, int):
            if not seq.params.no_stop_trim:
                text_ids = ids[:-1]
        text = tok.decode(text_ids, skip_special_tokens=seq.params.skip_special_tokens)
        if finish is not None and isinstance(finish.matched, str) and not seq.params.no_stop_trim:
            cut = text.find(finish.matched)
            if cut >= 0:
                text = text[:cut]
        logprobs = None
        if req.return_logprob:
            texts = (
                [tok.decode([t]) for t in ids] if req.return_text_in_logprobs else [None] * len(ids)
            )
            logprobs = [(lp, t, s) for lp, t, s in zip(seq.logprobs, ids, texts, strict=True)]
        meta = MetaInfo(
            id=seq.rid,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(ids),
            finish_reason=finish,
            weight_version=seq.weight_version,
            weight_versions=_spans(seq.version_events),
            output_token_logprobs=logprobs,
            routed_experts=_routes(seq),
        )
        return GenerateOutput(text=text, output_ids=list(ids), meta_info=meta)


def _routes(seq: Sequence) -> str | None:
    if not seq.want_routes:
        return None
    from spade_async.generation.route_capture import assemble
    from spade_async.generation.routed_experts import encode_sglang

    seqlen = len(seq.prompt_ids) + len(seq.output_ids)
    return encode_sglang(assemble(seq.routes, seqlen, min(seq.route_start, seqlen - 1)))


def _spans(events: list[tuple[str, int]]) -> list[WeightVersionSpan]:
    """SGLang's ``compute_weight_version_spans``: (version, tokens before it was replaced)
    events -> consecutive ``[start, end)`` spans, one per version."""
    spans: list[WeightVersionSpan] = []
    for version, end in events:
        if spans and end <= spans[-1].end:
            continue
        if spans and version == spans[-1].version:
            spans[-1].end = end
            continue
        spans.append(
            WeightVersionSpan(version=version, start=spans[-1].end if spans else 0, end=end)
        )
    return spans


def build_app(app: EngineApp) -> Starlette:
    import functools

    from spade_async.generation import lora

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette):
        app.engine.start()
        try:
            yield
        finally:
            app.lora.stop()
            app.engine.stop()

    handlers = {
        routes.GENERATE: app.generate,
        routes.HEALTH: app.health,
        routes.MODEL_INFO: app.model_info,
        routes.SERVER_INFO: app.server_info,
        routes.GET_SERVER_INFO: app.server_info,
        routes.FLUSH_CACHE: app.flush_cache,
        routes.PAUSE: app.pause,
        routes.CONTINUE: app.resume,
        routes.UPDATE_FROM_DISK: app.update_from_disk,
        routes.RELEASE_MEMORY: app.release_memory,
        routes.RESUME_MEMORY: app.resume_memory,
        routes.BEGIN_UPDATE: app.begin_update,
        routes.END_UPDATE: app.end_update,
        routes.DESTROY_WEIGHT_GROUP: app.destroy_group,
        # GPU-only paths: refused outside a session as SGLang does, else "not supported"
        routes.INIT_WEIGHT_GROUP: app.unsupported,
        routes.UPDATE_FROM_DISTRIBUTED: app.update_distributed,
        routes.UPDATE_FROM_TENSOR: app.update_tensor,
        # ---- LoRA adapters (generation/lora.py: SGLang's load/unload semantics) ----
        routes.LOAD_LORA: functools.partial(lora.load_handler, app.lora),
        routes.UNLOAD_LORA: functools.partial(lora.unload_handler, app.lora),
        routes.LOAD_LORA_FROM_TENSORS: functools.partial(lora.from_tensors_handler, app.lora),
    }
    # every path and method is one of the endpoint table's (a subset of SGLang's: contract)
    table = [Route(e.path, handlers[e], methods=[e.method]) for e in routes.ENDPOINTS]
    return Starlette(routes=table, lifespan=lifespan)


def make_engine_app(
    model: str,
    *,
    dtype: str = "float32",
    max_running: int = 64,
    context_length: int | None = None,
    weight_version: str = "0",
    enable_lora: bool = False,
    max_lora_rank: int = 0,
    priority: PriorityPolicy | None = None,
    radix_cache: bool = True,
    routed_experts: bool = False,
    deterministic: bool = False,
) -> EngineApp:
    """Load ``model`` (name or directory) and wrap it; raises ConfigError on a bad model.
    ``enable_lora`` serves adapters (``/load_lora_adapter``) of rank <= ``max_lora_rank``;
    ``priority``: SGLang's priority scheduling (``PriorityPolicy``); ``radix_cache=False``
    (``--disable-radix-cache``) keeps no finished request's KV for its next turn;
    ``routed_experts`` (``--enable-return-routed-experts``, MoE models only) returns each
    request's routes when it asks (route_capture.py). ``deterministic`` (``--deterministic``):
    a request's tokens depend on nothing but itself and the weights -- one sequence runs at a
    time (a batch's padding and shapes change float sums), no prefix cache (cached KV differs
    from a fresh prefill in the last bits), no preemption, and a request without a seed is
    sampled with one hashed from its prompt, never the clock (docs/determinism.md)."""
    from spade_async.models import load_causal_lm, resolve_model

    path = str(resolve_model(model))
    lm, tokenizer = load_causal_lm(path, dtype=dtype)
    ctx = context_length or int(getattr(lm.config, "max_position_embeddings", 0) or 4096)
    if routed_experts:
        from spade_async.errors import ConfigError
        from spade_async.generation.routed_experts import route_shape

        if route_shape(lm.config) is None:
            raise ConfigError(
                f"--enable-return-routed-experts: {path} is a dense model (no MoE router); "
                "drop the flag"
            )
    if deterministic:
        max_running, radix_cache = 1, False
        if priority is not None:
            priority = dataclasses.replace(priority, preemption_threshold=None)
    engine = Engine(
        lm,
        tokenizer,
        max_running=max_running,
        weight_version=weight_version,
        priority=priority,
        prefix_cache_bytes=PREFIX_CACHE_BYTES if radix_cache else 0,
        routed_experts=routed_experts,
    )
    app = EngineApp(engine, model_path=path, context_length=ctx, dtype=dtype)
    app.lora.enabled, app.lora.max_rank = enable_lora, max_lora_rank
    app.deterministic = deterministic
    return app


@contextlib.contextmanager
def serve_in_thread(app: EngineApp, *, host: str = "127.0.0.1", port: int = 0):
    """Serve ``app`` from a background thread (tests, benchmarks); yields the base URL."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(build_app(app), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("in-thread engine server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spade_async.generation.server")
    parser.add_argument("--model", required=True, help="embedded model name or HF model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--max-running-requests", "--max-running", dest="max_running", type=int, default=64,
        help="max sequences decoded together (SGLang's --max-running-requests)",
    )  # fmt: skip
    # priority scheduling, as SGLang's flags (generation/priority.py)
    parser.add_argument("--enable-priority-scheduling", action="store_true")
    parser.add_argument("--schedule-low-priority-values-first", action="store_true")
    parser.add_argument("--default-priority-value", type=int, default=None)
    parser.add_argument("--abort-on-priority-when-disabled", action="store_true")
    parser.add_argument("--disable-priority-preemption", action="store_true")
    parser.add_argument("--priority-scheduling-preemption-threshold", type=int, default=10)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--weight-version", default="0")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--deterministic", action="store_true",
        help="one sequence at a time, no prefix cache, 1 thread unless --threads: a request's "
        "tokens depend only on itself and the weights (docs/determinism.md)",
    )  # fmt: skip
    # LoRA, as SGLang's flags (generation/lora.py); target modules come from each adapter
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    parser.add_argument("--max-lora-rank", type=int, default=0, help="refuse adapters above it")
    parser.add_argument("--lora-target-modules", nargs="*", default=[], help="(SGLang's flag)")
    parser.add_argument(
        "--disable-radix-cache", action="store_true",
        help="keep no finished request's KV for the next turn of its conversation",
    )  # fmt: skip
    parser.add_argument(
        "--enable-return-routed-experts", action="store_true",
        help="return each request's MoE routes when it asks (SGLang's flag; MoE models only)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from spade_async.errors import SpadeError

    if args.deterministic and not args.threads:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        app = make_engine_app(
            args.model,
            dtype=args.dtype,
            max_running=args.max_running,
            context_length=args.context_length,
            weight_version=args.weight_version,
            enable_lora=args.enable_lora,
            max_lora_rank=args.max_lora_rank,
            radix_cache=not args.disable_radix_cache,
            routed_experts=args.enable_return_routed_experts,
            deterministic=args.deterministic,
            priority=PriorityPolicy(
                enabled=args.enable_priority_scheduling,
                low_first=args.schedule_low_priority_values_first,
                default=args.default_priority_value,
                abort_when_disabled=args.abort_on_priority_when_disabled,
                preemption_threshold=None
                if args.disable_priority_preemption
                else args.priority_scheduling_preemption_threshold,
            ),
        )
    except SpadeError as exc:
        print(f"spade-engine: error: {exc}", file=sys.stderr)
        return 2
    import os

    import uvicorn

    app.on_fatal = lambda: os._exit(70)  # SGLang's server dies with its scheduler
    uvicorn.run(build_app(app), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
