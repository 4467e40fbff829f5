"""The CPU engine's control routes: pause/continue, weight-update sessions, updates from
disk, memory release/resume, flush, health and model info, each judged by SGLang 0.5.23's
control-plane state machine (``sglang_state.py``) before it acts. ``ControlRoutes`` is a
mixin of ``server.EngineApp``: it uses the app's ``engine``, ``sgl``, ``model_path``,
``dtype``, ``vocab_size``, ``_update_lock``, ``_spare`` and ``on_fatal``."""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from spade_async.generation import routes, sglang_state
from spade_async.generation.engine import EngineBusy
from spade_async.generation.protocol import (
    BeginWeightUpdateReqInput,
    DestroyWeightsUpdateGroupReqInput,
    MemoryOccupationReqInput,
    ModelInfo,
    PauseGenerationReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    UpdateWeightsReqOutput,
)
from spade_async.generation.sglang_state import Verdict

__all__ = ["ControlRoutes"]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class ControlRoutes:
    """SGLang's control routes over ``self.engine`` (see the module docstring)."""

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
        if v.ok:  # SGLang drops the whole radix cache: every adapter's engine here
            self.engine.flush_prefix_cache()
            for _, engine in self.lora.adapters.values():
                engine.flush_prefix_cache()
        # HTTP flush_cache: plain text, 200 or 400
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
            self.engine.pause(abort=req.mode == "abort", retract=req.mode == "retract")
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
        except EngineBusy as exc:  # requests running or waiting (retracted ones too, which
            self.sgl.offload_tags = before  # SGLang's paused scheduler ignores): not released
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


def _next_version(current: str) -> str:
    return str(int(current) + 1) if current.isdigit() else f"{current}+1"
