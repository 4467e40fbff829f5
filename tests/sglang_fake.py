"""A fake SGLang server for ``httpx.MockTransport`` that keeps SGLang 0.5.23's state machine
(``spade_async.generation.sglang_state``): it refuses what SGLang refuses, answers with
SGLang's statuses and bodies, and records every call with its verdict. ``FakeNCCL`` stands
in for the weight group's broadcast: a bucket's broadcast completes only once every engine
accepted its ``/update_weights_from_distributed`` (a refused one never joins, as SGLang)."""

from __future__ import annotations

import json
import threading
from collections import Counter

import httpx

from spade_async.generation.sglang_state import SGLangState, apply


class FakeNCCL:
    def __init__(self, receivers: int, timeout_s: float = 10.0) -> None:
        self.receivers, self.timeout_s = receivers, timeout_s
        self.cond = threading.Condition()
        self.joined: Counter[int] = Counter()
        self.sent: list = []  # the broadcast tensors, in order

    def receive(self, bucket: int) -> None:
        """An engine joins bucket ``bucket``'s broadcast; returns once it was sent."""
        with self.cond:
            self.joined[bucket] += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: len(self.sent) > bucket, self.timeout_s)

    def broadcast(self, t, group):
        with self.cond:
            self.sent.append(t.clone())
            self.cond.notify_all()
            return _Work(self, len(self.sent) - 1)


class _Work:
    def __init__(self, nccl: FakeNCCL, bucket: int) -> None:
        self.nccl, self.bucket = nccl, bucket

    def is_completed(self) -> bool:
        with self.nccl.cond:
            return self.nccl.joined[self.bucket] >= self.nccl.receivers


class ModelledSGLang:
    """One SGLang server's HTTP control plane. ``refuse={path: message}`` plants a refusal
    (HTTP 400, success false) on a route; ``lie`` reports the old version after updates."""

    def __init__(
        self,
        *,
        version: str = "0",
        refuse: dict[str, str] | None = None,
        lie: bool = False,
        nccl: FakeNCCL | None = None,
    ) -> None:
        self.state = SGLangState(version)
        self.requests: list[tuple[str, dict]] = []
        self.refuse, self.lie, self.nccl = dict(refuse or {}), lie, nccl
        self.buckets = 0  # accepted distributed updates (= broadcasts joined)

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def refused(self):
        return self.state.refused()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/model_info":
            return httpx.Response(200, json={"model_path": "/m", "is_generation": True,
                                             "weight_version": self.state.weight_version})
        if path == "/health":
            return httpx.Response(503 if self.state.dead else 200)
        if path in self.refuse:
            from spade_async.generation.sglang_state import Verdict

            v = self.state.judge(path, Verdict(ok=False, status=400, message=self.refuse[path]))
        else:
            before = self.state.weight_version
            v = apply(self.state, path, body)
            if self.lie:
                self.state.weight_version = before
        if v.ok and path == "/update_weights_from_distributed" and self.nccl is not None:
            self.nccl.receive(self.buckets)
            self.buckets += 1
        if v.fatal:
            return httpx.Response(500, json={"error": {"message": v.message}})
        if path in ("/pause_generation", "/continue_generation") and v.ok:
            return httpx.Response(200, json={"message": v.message, "status": "ok"})
        if path in ("/release_memory_occupation", "/resume_memory_occupation") and v.ok:
            return httpx.Response(200, json=None)
        return httpx.Response(v.status, json=v.body())


def transport(engines: dict[str, ModelledSGLang]) -> httpx.MockTransport:
    """One transport for several fake servers, by host: {"http://a": engine, ...}."""
    return httpx.MockTransport(lambda r: engines[f"http://{r.url.host}"](r))


class ModelledLoRA:
    """SGLang 0.5.23's adapter serving for ``httpx.MockTransport`` (async handler):
    ``lora/lora_registry.py`` and ``tokenizer_control_mixin`` of the pinned wheel, with the
    messages ``generation/lora.py`` models. A second ``/load_lora_adapter`` of a loaded name,
    an ``/unload_lora_adapter`` of an unknown one and a ``/generate`` naming an adapter that
    is not loaded are refused (HTTP 400); an unload waits for the in-flight requests on its
    adapter; ``meta_info.weight_version`` stays the base's (SGLang bumps it on weight
    updates only, never on adapter loads). ``gate``: when set, generation waits on it."""

    def __init__(self, *, weight_version: str = "0") -> None:
        self.weight_version = weight_version
        self.loaded: dict[str, str] = {}
        self.inflight: Counter[str] = Counter()
        self.requests: list[tuple[str, dict]] = []
        self.refusals: list[tuple[str, str]] = []
        self.gate = None  # an anyio.Event generation waits for

    def _refuse(self, path: str, message: str, *, generate: bool = False) -> httpx.Response:
        self.refusals.append((path, message))
        if generate:
            return httpx.Response(400, json={"error": {"message": message}})
        return httpx.Response(400, json={"success": False, "error_message": message,
                                         "loaded_adapters": dict(self.loaded)})  # fmt: skip

    def _load(self, body: dict) -> httpx.Response | None:
        name = body["lora_name"]
        if name in self.loaded:
            return self._refuse("/load_lora_adapter", f"LoRA with name {name} already exists. "
                                                      f"Loaded LoRAs: {sorted(self.loaded)}")  # fmt: skip
        self.loaded[name] = body["lora_path"]
        return None

    def _unload(self, body: dict) -> httpx.Response | None:
        name = body["lora_name"]
        if name not in self.loaded:
            return self._refuse("/unload_lora_adapter", f"LoRA with name {name} does not exist. "
                                                        f"Loaded LoRAs: {sorted(self.loaded)}")  # fmt: skip
        self.loaded.pop(name)  # no new request on it from now on
        return None

    def _ok(self) -> httpx.Response:
        return httpx.Response(200, json={"success": True, "error_message": None,
                                         "loaded_adapters": dict(self.loaded)})  # fmt: skip

    def sync(self, request: httpx.Request) -> httpx.Response:
        """The control routes for a sync ``httpx.Client`` (the trainer's push)."""
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/load_lora_adapter":
            return self._load(body) or self._ok()
        if path == "/unload_lora_adapter":
            if self.inflight[body["lora_name"]]:
                raise AssertionError("a sync unload would block on in-flight requests")
            return self._unload(body) or self._ok()
        return httpx.Response(404)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        import anyio

        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/load_lora_adapter":
            if (refused := self._load(body)) is not None:
                return refused
        elif path == "/unload_lora_adapter":
            if (refused := self._unload(body)) is not None:
                return refused
            while self.inflight[body["lora_name"]]:  # returns once those on it have finished
                await anyio.sleep(0.005)
        elif path == "/generate":
            name = body.get("lora_path")
            if name is not None and name not in self.loaded:
                return self._refuse(
                    path,
                    f"The following requested LoRA adapters are not loaded: {name}\n"
                    f"Loaded adapters: {sorted(self.loaded)}.",
                    generate=True,
                )
            self.inflight[name] += 1
            try:
                if self.gate is not None:
                    await self.gate.wait()
            finally:
                self.inflight[name] -= 1
            return httpx.Response(200, json={"text": "", "output_ids": [5], "meta_info": {
                "id": "r", "prompt_tokens": 1, "completion_tokens": 1,
                "finish_reason": {"type": "length", "length": 1},
                "output_token_logprobs": [[-0.25, 5, None]],
                "weight_version": self.weight_version}})  # fmt: skip
        else:
            return httpx.Response(404)
        return self._ok()
