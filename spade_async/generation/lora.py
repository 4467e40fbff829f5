"""LoRA adapters over HTTP: SGLang 0.5.23's request structs, and the CPU engine's routes.

SGLang (``--enable-lora --max-lora-rank R --lora-target-modules ...``) serves a frozen base
plus named adapters: ``POST /load_lora_adapter {lora_name, lora_path}`` registers one (a
second load of a loaded name is refused), ``POST /generate {..., lora_path: NAME}`` runs a
request on it (an unknown name is refused), and ``POST /unload_lora_adapter {lora_name}``
first stops new requests from using the name, then waits until every in-flight request that
uses it has finished, and only then frees it (``tokenizer_control_mixin`` and
``lora/lora_registry.py`` of the pinned wheel). ``/load_lora_adapter_from_tensors`` takes
serialised (CUDA) tensors. Every reply is a ``LoRAUpdateOutput`` {success, error_message,
loaded_adapters}; a refusal is HTTP 400.

``LoraServing`` gives the CPU engine the same behaviour: each loaded adapter is an
``Engine`` of its own over a fresh copy of the base weights with W + (alpha / r) B A merged
in (the CPU engine batches one model per engine), so a request's adapter never changes
under it, and unloading waits for that engine's in-flight requests exactly as SGLang's
registry does. The routes live here, delimited from the weight-update ones in server.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import anyio
import msgspec

__all__ = [
    "LoadLoRAAdapterReqInput",
    "UnloadLoRAAdapterReqInput",
    "LoadLoRAAdapterFromTensorsReqInput",
    "LoRAUpdateOutput",
    "LoraServing",
    "merge_adapter",
    "adapter_name",
    "adapter_version",
]

_NAME = re.compile(r"spade-v(\d+)(?:\.(\d+))?")


def adapter_name(version: int, again: int = 0) -> str:
    """The name policy ``version``'s adapter is loaded under: ``spade-v{N}``, and
    ``spade-v{N}.{k}`` for the k-th load of the same version again (a restarted trainer or
    engine re-pushes a version; SGLang refuses a second load of a loaded name)."""
    return f"spade-v{version}" if again == 0 else f"spade-v{version}.{again}"


def adapter_version(name: str) -> int:
    """``spade-v{N}[.k]`` -> N: the policy version of the tokens a request on it generated
    (SGLang keeps ``weight_version`` at the base's on adapter loads)."""
    m = _NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"'{name}' is not an adapter name of this project (spade-v<N>[.<k>])")
    return int(m.group(1))


class LoadLoRAAdapterReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /load_lora_adapter``: a peft adapter directory under a new name."""

    lora_name: str
    lora_path: str
    pinned: bool = False


class UnloadLoRAAdapterReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /unload_lora_adapter``."""

    lora_name: str


class LoadLoRAAdapterFromTensorsReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /load_lora_adapter_from_tensors`` (serialised tensors; SGLang on GPU)."""

    lora_name: str
    config_dict: dict
    # one base64 payload per engine TP rank (SGLang: Annotated[List[bytes], Base64Bytes()])
    serialized_named_tensors: list[str]
    load_format: str | None = None
    pinned: bool = False


class LoRAUpdateOutput(msgspec.Struct, kw_only=True):
    """Reply of the three LoRA routes (SGLang's ``LoRAUpdateOutput``)."""

    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, str] | None = None


def merge_adapter(model: Any, adapter_dir: str | Path, *, max_rank: int = 0) -> int:
    """Add (alpha / r) B A of peft's adapter files into ``model``'s weights in place; returns
    the rank. Raises ValueError for what SGLang would refuse (rank above max_rank, a module
    the model lacks, files missing)."""
    import torch
    from safetensors.torch import load_file

    path = Path(adapter_dir)
    cfg_file, tensors_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_file.is_file() or not tensors_file.is_file():
        raise ValueError(f"'{path}' holds no peft adapter (adapter_config.json + safetensors)")
    cfg = json.loads(cfg_file.read_text())
    rank, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    if max_rank and rank > max_rank:
        raise ValueError(f"LoRA rank {rank} exceeds the server's --max-lora-rank {max_rank}")
    tensors = load_file(str(tensors_file))
    params = dict(model.named_parameters())
    scale = alpha / rank
    done = 0
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        name = f"{module}.weight"
        if name not in params:
            raise ValueError(f"the adapter targets '{module}', which the served model lacks")
        w = params[name]
        with torch.no_grad():
            w.add_((scale * (b.double() @ a.double())).to(w.dtype))
        done += 1
    if not done:
        raise ValueError(f"'{path}' has no lora_A/lora_B tensors")
    return rank


class LoraServing:
    """The CPU engine's adapters: name -> (path, Engine), SGLang's load/unload semantics."""

    def __init__(self, app: Any, *, enabled: bool, max_rank: int = 0) -> None:
        self.app = app  # server.EngineApp (base model path, tokenizer, dtype)
        self.enabled, self.max_rank = enabled, max_rank
        self.adapters: dict[str, tuple[str, Any]] = {}
        self._lock = asyncio.Lock()

    def loaded(self) -> dict[str, str]:
        return {name: path for name, (path, _) in self.adapters.items()}

    def engine_for(self, name: str):
        """The Engine that serves adapter ``name``; KeyError text as SGLang's registry."""
        if name not in self.adapters:
            raise KeyError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {sorted(self.adapters)}."
            )
        return self.adapters[name][1]

    def _build(self, lora_path: str, version: str):
        from spade_async.generation.engine import Engine
        from spade_async.models import load_causal_lm

        model, tokenizer = load_causal_lm(self.app.model_path, dtype=self.app.dtype)
        merge_adapter(model, lora_path, max_rank=self.max_rank)
        base = self.app.engine
        return Engine(
            model,
            tokenizer,
            max_running=base.max_running,
            max_prefill_tokens=base.max_prefill_tokens,
            weight_version=version,
            priority=base.priority,
            prefix_cache_bytes=base.prefix.max_bytes,  # --disable-radix-cache reaches it too
            routed_experts=base.routed_experts,  # --enable-return-routed-experts too
        )

    def _refuse(self, message: str, path: str = ""):
        if path:
            self.record(path, ok=False, message=message)
        return LoRAUpdateOutput(success=False, error_message=message, loaded_adapters=self.loaded())

    def record(self, path: str, *, ok: bool, message: str) -> None:
        """One LoRA call into the engine's call log (``SPADE_ENGINE_TRACE``: the loop tests'
        recorder fails a test on any refusal); ``message`` names the adapter."""
        from spade_async.generation.sglang_state import Call, Verdict

        sgl = self.app.sgl
        if ok and path == "/generate":  # one per request: traced only, not kept in sgl.calls
            if sgl.on_call is not None:
                sgl.on_call(Call(path=path, ok=True, message=message))
            return
        sgl.judge(path, Verdict(ok=ok, status=200 if ok else 400, message=message))

    async def load(self, req: LoadLoRAAdapterReqInput) -> LoRAUpdateOutput:
        path = "/load_lora_adapter"
        if not self.enabled:
            return self._refuse(
                "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", path
            )
        async with self._lock:
            if req.lora_name in self.adapters:
                return self._refuse(
                    f"LoRA with name {req.lora_name} already exists. "
                    f"Loaded LoRAs: {sorted(self.adapters)}",
                    path,
                )
            # the adapter's weight version: the engine's base version (as SGLang reports it)
            version = self.app.engine.weight_version
            try:
                engine = await anyio.to_thread.run_sync(self._build, req.lora_path, version)
            except Exception as exc:  # a failed load is an answer; the others keep serving
                return self._refuse(f"failed to load LoRA adapter {req.lora_path}: {exc}", path)
            engine.start()
            self.adapters[req.lora_name] = (req.lora_path, engine)
        self.record(path, ok=True, message=f"lora_name={req.lora_name}")
        return LoRAUpdateOutput(success=True, loaded_adapters=self.loaded())

    async def unload(self, req: UnloadLoRAAdapterReqInput) -> LoRAUpdateOutput:
        path = "/unload_lora_adapter"
        if not self.enabled:
            return self._refuse(
                "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", path
            )
        async with self._lock:
            if req.lora_name not in self.adapters:
                return self._refuse(
                    f"LoRA with name {req.lora_name} does not exist. "
                    f"Loaded LoRAs: {sorted(self.adapters)}",
                    path,
                )
            # new requests stop using it now; the ones running finish on it
            _, engine = self.adapters.pop(req.lora_name)
        while engine.load() > 0:
            await asyncio.sleep(0.01)
        await anyio.to_thread.run_sync(engine.stop)
        self.record(path, ok=True, message=f"lora_name={req.lora_name}")
        return LoRAUpdateOutput(success=True, loaded_adapters=self.loaded())

    def stop(self) -> None:
        for _, engine in self.adapters.values():
            engine.stop()
        self.adapters.clear()


# ---- HTTP handlers (registered by server.build_app) -----------------------------------------
def _reply(out: LoRAUpdateOutput):
    from starlette.responses import Response

    return Response(
        msgspec.json.encode(out),
        status_code=200 if out.success else 400,
        media_type="application/json",
    )


async def load_handler(serving: LoraServing, request) -> Any:
    try:
        req = msgspec.json.decode(await request.body(), type=LoadLoRAAdapterReqInput)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return _reply(LoRAUpdateOutput(success=False, error_message=str(exc)))
    return _reply(await serving.load(req))


async def unload_handler(serving: LoraServing, request) -> Any:
    try:
        req = msgspec.json.decode(await request.body(), type=UnloadLoRAAdapterReqInput)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return _reply(LoRAUpdateOutput(success=False, error_message=str(exc)))
    return _reply(await serving.unload(req))


async def from_tensors_handler(serving: LoraServing, request) -> Any:
    return _reply(
        serving._refuse(
            "/load_lora_adapter_from_tensors takes serialised GPU tensors, which the CPU "
            "engine cannot map: use /load_lora_adapter with a peft adapter directory"
        )
    )


def launch_args(rank: int, target_modules: list[str] | tuple[str, ...]) -> list[str]:
    """The server flags that serve adapters of this rank on these modules (SGLang's, which
    the CPU engine's server takes too)."""
    return [
        "--enable-lora",
        "--max-lora-rank",
        str(rank),
        "--lora-target-modules",
        *target_modules,
    ]
