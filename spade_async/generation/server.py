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
``top_logprobs_num``, input-token log-probs (``logprob_start_len`` >= 0). There is no
prefix cache, so ``/flush_cache`` has nothing to drop.

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
import copy
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.generation import routes, sglang_state
from spade_async.generation.engine import Engine, EngineBusy, Sequence, now_seed
from spade_async.generation.protocol import (
    BeginWeightUpdateReqInput,
    DestroyWeightsUpdateGroupReqInput,
    GenerateOutput,
    GenerateReqInput,
    MemoryOccupationReqInput,
    MetaInfo,
    ModelInfo,
    PauseGenerationReqInput,
    SamplingParams,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    UpdateWeightsReqOutput,
    WeightVersionSpan,
)
from spade_async.generation.sglang_state import SGLangState, Verdict

__all__ = ["EngineApp", "build_app", "make_engine_app", "serve_in_thread", "main"]


class RoutedGenerateReqInput(GenerateReqInput, kw_only=True):
    """``/generate`` as the CPU engine decodes it: SGLang's body plus the OpenAI-style
    ``model`` that sglang-router adds when it forwards a request (SGLang's HTTP layer drops
    it before its ``GenerateReqInput``; the contract checks what the client sends)."""

    model: str | None = None


class BadRequest(Exception):
    pass


def _json(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class EngineApp:
    """HTTP handlers around one ``Engine``."""

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

    # ---- /generate -------------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = self._decode_gen.decode(await request.body())
            prompts, params, rids, single = self._normalise(req)
            engines = self._engines(req.lora_path, len(prompts))
            seqs = [
                self._sequences(p, sp, rid)
                for p, sp, rid in zip(prompts, params, rids, strict=True)
            ]
        except (msgspec.ValidationError, msgspec.DecodeError, BadRequest) as exc:
            return _error(str(exc))
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

    def _sequences(self, prompt: list[int], sp: SamplingParams, rid: str | None) -> list[Sequence]:
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
        base = sp.sampling_seed if sp.sampling_seed is not None else now_seed()
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
        )
        return GenerateOutput(text=text, output_ids=list(ids), meta_info=meta)

    # ---- control (SGLang 0.5.23's state machine: sglang_state.py) ------------------------
    def _judge(self, path: str, body: dict | None) -> Verdict:
        return sglang_state.apply(self.sgl, path, body or {})

    def _answer(self, verdict: Verdict, ok_body: Any = None) -> Response:
        """SGLang's reply for a judged call: ``ok_body`` (default ``{success, message}``) on
        success, ``{success: false, message}`` with SGLang's status when refused; a fatal
        verdict kills the server (SGLang's scheduler died)."""
        if verdict.fatal:
            self._die(verdict.message)
            return _error(f"server died: {verdict.message}", status=500)
        if not verdict.ok:
            return JSONResponse(verdict.body(), status_code=verdict.status)
        return JSONResponse(verdict.body() if ok_body is None else ok_body)

    def _die(self, why: str) -> None:
        """SGLang's scheduler raised: it is gone and its server with it. Here every later
        call fails (503) and ``on_fatal`` runs (the process exits: the supervisor restarts)."""
        print(f"spade-engine: fatal (as SGLang's scheduler would die): {why}", file=sys.stderr)
        self.engine.pause(abort=True)  # its requests end with it
        if self.on_fatal is not None:
            asyncio.get_running_loop().call_later(0.2, self.on_fatal)

    async def _body(self, request: Request, struct: type) -> Any:
        return msgspec.json.decode(await request.body() or b"{}", type=struct)

    def _dead(self, request: Request) -> Response | None:
        if self.sgl.dead:  # recorded as refused, like every call after the death
            self.sgl.judge(request.url.path, Verdict(ok=False))
            return _error(f"server died: {self.sgl.dead}", status=503)
        return None

    async def health(self, request: Request) -> Response:
        """SGLang /health run with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 (as the
        launcher starts it): 200 while the server lives, paused or not."""
        alive = self.engine._thread is not None and self.engine._thread.is_alive()
        return Response(status_code=200 if alive and not self.sgl.dead else 503)

    async def model_info(self, request: Request) -> Response:
        return _json(
            ModelInfo(
                model_path=self.model_path,
                tokenizer_path=self.model_path,
                is_generation=True,
                weight_version=self.sgl.weight_version,
            )
        )

    async def server_info(self, request: Request) -> Response:
        """What sglang-router reads when it registers a worker (model id, context length)."""
        return JSONResponse(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "served_model_name": self.model_path,
                "context_length": self.context_length,
                "weight_version": self.sgl.weight_version,
                "version": "spade-async-cpu",
            }
        )

    async def flush_cache(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        v = self._judge(routes.FLUSH_CACHE.path, None)
        # HTTP flush_cache: plain text, 200 or 400 (nothing cached here to drop)
        return Response("Cache flushed." if v.ok else v.message, status_code=v.status)

    async def pause(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = await self._body(request, PauseGenerationReqInput)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(f"pause_generation: {exc}", status=422)
        v = self._judge(routes.PAUSE.path, {"mode": req.mode})
        if v.ok:
            self.engine.pause(abort=req.mode == "abort")
            if req.mode == "abort":  # TM.pause_generation returns once no request is left
                with anyio.move_on_after(60):
                    while self.engine.active:
                        await asyncio.sleep(0.01)
        return self._answer(v, {"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        v = self._judge(routes.CONTINUE.path, None)
        self.engine.resume()
        return self._answer(v, {"message": "Generation continued successfully.", "status": "ok"})

    async def begin_update(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = await self._body(request, BeginWeightUpdateReqInput)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(str(exc), status=422)
        return self._answer(self._judge(routes.BEGIN_UPDATE.path, {"selector": req.selector}))

    async def end_update(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        return self._answer(self._judge(routes.END_UPDATE.path, None))

    async def destroy_group(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = await self._body(request, DestroyWeightsUpdateGroupReqInput)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(str(exc), status=422)
        v = self._judge(routes.DESTROY_WEIGHT_GROUP.path, {"group_name": req.group_name})
        return self._answer(v)

    async def update_from_disk(self, request: Request) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = msgspec.json.decode(await request.body(), type=UpdateWeightFromDiskReqInput)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(str(exc))
        path = routes.UPDATE_FROM_DISK.path
        fault = self.sgl._weights_resident(path)  # loading into released weights: fatal
        if fault is not None:
            return self._answer(self.sgl.judge(path, fault))
        async with self._update_lock:  # one update at a time: the spare model is shared
            try:
                model = await anyio.to_thread.run_sync(self._load_weights, req.model_path)
            except Exception as exc:  # a failed load is an answer, the old weights keep serving
                v = self.sgl.judge(
                    path,
                    Verdict(
                        ok=False, status=400, message=f"failed to load {req.model_path}: {exc}"
                    ),
                )
                return _json(UpdateWeightFromDiskReqOutput(success=False, message=v.message), 400)
            running = self.engine.load()
            version = req.weight_version or _next_version(self.engine.weight_version)
            old = self.engine.model
            fut = self.engine.swap_model(model, version, abort=req.abort_all_requests)
            await asyncio.wrap_future(fut)
            # the old model is now idle: the next update is copied into it
            self._spare = None if self.engine.released else old
            # the weights changed; the flush after them may still fail the call (in_place)
            v = self.sgl.judge(path, self.sgl._updated(version, req.flush_cache))
        self.model_path = req.model_path
        out = UpdateWeightFromDiskReqOutput(
            success=v.ok,
            message=f"loaded {req.model_path} as weight version {version}" if v.ok else v.message,
            num_paused_requests=running,
        )
        return _json(out, status=v.status)

    def _load_weights(self, path: str) -> Any:
        """The new model: the checkpoint's tensors copied into a spare copy of the serving
        model when names and shapes match (no model construction), else a full load."""
        from spade_async.models import load_causal_lm

        file = Path(path) / "model.safetensors"
        if file.is_file() and not self.engine.released:
            spare = self._spare if self._spare is not None else copy.deepcopy(self.engine.model)
            self._spare = None  # filled or not, it is this update's now
            if _copy_checkpoint(spare, file):
                return spare
        model, _ = load_causal_lm(path, dtype=self.dtype)
        if int(model.config.vocab_size) != self.vocab_size:
            raise ValueError(
                f"vocab size {model.config.vocab_size} != serving model's {self.vocab_size}"
            )
        return model

    async def release_memory(self, request: Request) -> Response:
        return await self._memory(request, routes.RELEASE_MEMORY.path, self.engine.release_memory)

    async def resume_memory(self, request: Request) -> Response:
        return await self._memory(request, routes.RESUME_MEMORY.path, self.engine.resume_memory)

    async def _memory(self, request: Request, path: str, action) -> Response:
        if (dead := self._dead(request)) is not None:
            return dead
        try:
            req = msgspec.json.decode(await request.body() or b"{}", type=MemoryOccupationReqInput)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(str(exc), status=422)
        before = set(self.sgl.offload_tags)
        v = self._judge(path, {"tags": req.tags})
        if not v.ok:
            return self._answer(v)
        try:
            action(req.tags or list(sglang_state.MEMORY_TAGS))
        except EngineBusy as exc:  # SGLang would retract the running rows; this engine keeps
            self.sgl.offload_tags = before  # them (retract = in_place here): not released
            return _error(str(exc), status=409)
        if "weights" in self.engine.released:
            self._spare = None  # released weights: no second copy either
        return _json(None)  # HTTP release/resume_memory_occupation return nothing: null

    async def update_distributed(self, request: Request) -> Response:
        return await self._gpu_only(request, routes.UPDATE_FROM_DISTRIBUTED.path)

    async def update_tensor(self, request: Request) -> Response:
        return await self._gpu_only(request, routes.UPDATE_FROM_TENSOR.path)

    async def _gpu_only(self, request: Request, path: str) -> Response:
        """GPU-only updates: outside a weight-update session refused as SGLang refuses
        them (the session rule comes first there too), inside one not supported here."""
        if (dead := self._dead(request)) is not None:
            return dead
        if path in sglang_state.SESSION_ROUTES and self.sgl.session is None:
            body = msgspec.json.decode(await request.body() or b"{}")
            return self._answer(self._judge(path, body if isinstance(body, dict) else {}))
        return await self.unsupported(request)

    async def unsupported(self, request: Request) -> Response:
        msg = (
            f"{request.url.path} is not supported by the CPU engine "
            "(GPU/SGLang only); use /update_weights_from_disk"
        )
        self.sgl.judge(request.url.path, Verdict(ok=False, status=400, message=msg))
        return _json(UpdateWeightsReqOutput(success=False, message=msg), status=400)


def _tracer():
    """``SPADE_ENGINE_TRACE=DIR``: every control call and its verdict, one JSON line each, in
    ``DIR/engine-<pid>-<n>.jsonl`` (the contract recorder of the loop tests reads them)."""
    import itertools
    import os

    folder = os.environ.get("SPADE_ENGINE_TRACE", "")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        path = Path(folder) / f"engine-{os.getpid()}-{n}.jsonl"
        if not path.exists():
            break
    path.touch()

    def write(call) -> None:
        with open(path, "ab") as f:
            f.write(msgspec.json.encode(call) + b"\n")

    return write


def _copy_checkpoint(model: Any, file: Path) -> bool:
    """Copy the tensors of ``file`` (safetensors) into ``model``'s parameters; False (model
    partly written) when its names or shapes differ."""
    from safetensors import safe_open

    params = dict(model.named_parameters())  # tied weights appear once, as the export has them
    with safe_open(str(file), framework="pt") as f:
        if set(f.keys()) != params.keys():
            return False
        with torch.no_grad():
            for name in params:
                t = f.get_tensor(name)
                if t.shape != params[name].shape:
                    return False
                params[name].copy_(t)
    return True


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


def _next_version(current: str) -> str:
    return str(int(current) + 1) if current.isdigit() else f"{current}+1"


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
) -> EngineApp:
    """Load ``model`` (name or directory) and wrap it; raises ConfigError on a bad model.
    ``enable_lora`` serves adapters (``/load_lora_adapter``) of rank <= ``max_lora_rank``."""
    from spade_async.models import load_causal_lm, resolve_model

    path = str(resolve_model(model))
    lm, tokenizer = load_causal_lm(path, dtype=dtype)
    ctx = context_length or int(getattr(lm.config, "max_position_embeddings", 0) or 4096)
    engine = Engine(lm, tokenizer, max_running=max_running, weight_version=weight_version)
    app = EngineApp(engine, model_path=path, context_length=ctx, dtype=dtype)
    app.lora.enabled, app.lora.max_rank = enable_lora, max_lora_rank
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
        "--max-running", type=int, default=64, help="max sequences decoded together"
    )
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--weight-version", default="0")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    # LoRA, as SGLang's flags (generation/lora.py); target modules come from each adapter
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    parser.add_argument("--max-lora-rank", type=int, default=0, help="refuse adapters above it")
    parser.add_argument("--lora-target-modules", nargs="*", default=[], help="(SGLang's flag)")
    args = parser.parse_args(argv)
    from spade_async.errors import SpadeError

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
