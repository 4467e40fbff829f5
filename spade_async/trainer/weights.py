"""Push the trainer's weights to generation engines; the engine must then report our version.

Three paths, one per engine placement (every rank calls ``push_weights``; only rank 0 talks
HTTP):

- ``disk`` (CPU engine, or any SGLang): export HF safetensors (streamed shards) into a shared-memory (or temp)
  directory, ``POST /update_weights_from_disk {"model_path", "weight_version"}``, then
  ``GET /model_info`` must report the trainer's ``weight_version``. The previous export is
  removed once every engine has moved on.
- ``distributed`` (SGLang on other GPUs): once, ``POST /init_weights_update_group`` to each
  engine while rank 0 joins the same NCCL group as rank 0 (engines take ranks
  1..sum(tp)); then per bucket of parameters (``bucket_bytes``), ``POST
  /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name",
  "flush_cache", "weight_version"}`` in a thread while rank 0 broadcasts each tensor.
- ``tensor`` (SGLang colocated on the same GPUs): per bucket, CUDA IPC handles serialised
  with SGLang's ``MultiprocessingSerializer`` in ``POST /update_weights_from_tensor``, one
  payload per engine TP rank from the trainer rank on that GPU (ipc.py).

With ``pause_mode`` set (the async schedule: generation is in flight), rank 0 pauses the
engines (``/pause_generation``) only around the engine-side update (the disk export happens
before, while they keep generating) and continues them after (``/continue_generation``);
``stats["paused_s"]`` reports how long. Paused ``in_place``, running requests keep their KV
cache, so the updates carry ``flush_cache: false`` (SGLang refuses to flush then).

Every path sends the weights in the engine's dtype (``PushWeights.dtype``; '' = what the
engine serves, see ``stream.engine_dtype``), one bucket of full tensors at a time, each cast
on its shard before the all-gather: never an fp32 copy of the whole model (stream.py).

The GPU paths follow SGLang's documented HTTP API and are contract-tested on CPU (the
requests they send, with fake transports); they have not been run against a GPU here.
Side effects: importing SGLang (GPU paths only) sets multiprocessing to spawn.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from spade_async.errors import SpadeError
from spade_async.trainer.group import ensure_group
from spade_async.trainer.ipc import push_tensor
from spade_async.trainer.stream import (
    DISK_SHARD_BYTES,
    bucketed,
    buckets,
    engine_dtype,
    export_safetensors,
)

__all__ = [
    "WeightPushError",
    "push_weights",
    "push_disk",
    "push_distributed",
    "push_tensor",
    "buckets",
]


class WeightPushError(SpadeError):
    """An engine refused the weights or reports another version than the trainer's."""


def _check(url: str, resp: httpx.Response) -> dict:
    body = resp.json() if resp.content else {}
    if resp.status_code != 200 or not body.get("success", True):
        msg = body.get("message") or body.get("error") or resp.text
        raise WeightPushError(f"engine {url} refused the weight update ({resp.status_code}): {msg}")
    return body


def _verify(client: httpx.Client, url: str, version: int) -> str:
    got = client.get(f"{url}/model_info").json().get("weight_version")  # SGLang 0.5.23
    if str(got) != str(version):
        raise WeightPushError(
            f"engine {url} reports weight version {got!r} after the push, trainer is at {version}"
        )
    return str(got)


@contextlib.contextmanager
def _paused(client: httpx.Client, urls: list[str], mode: str, stats: dict | None):
    """Pause generation on every engine for the body (no-op when ``mode`` is empty)."""
    if not mode:
        yield
        return
    t0 = time.perf_counter()
    for url in urls:
        _check(url, client.post(f"{url}/pause_generation", json={"mode": mode}))
    try:
        yield
    finally:
        for url in urls:
            with contextlib.suppress(httpx.HTTPError):
                client.post(f"{url}/continue_generation", json={})
        if stats is not None:
            stats["paused_s"] = stats.get("paused_s", 0.0) + time.perf_counter() - t0


def _shm_root(shm_dir: str) -> Path:
    if shm_dir:
        return Path(shm_dir)
    return Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def push_disk(
    trainer,
    engines: list[str],
    *,
    shm_dir: str = "",
    timeout: float = 300.0,
    transport: httpx.BaseTransport | None = None,
    pause_mode: str = "",
    stats: dict | None = None,
    dtype: str = "",
) -> dict[str, str]:
    root = _shm_root(shm_dir) / f"spade-weights-{os.getppid()}"
    target = root / f"v{trainer.version}"
    # engines keep generating meanwhile; the export is in their dtype, one shard at a time
    as_dtype = engine_dtype(trainer.model_dir, dtype, sglang_auto=False)
    export_safetensors(trainer, target, as_dtype, DISK_SHARD_BYTES)
    if trainer.rank != 0:
        return {}
    out = {}
    with httpx.Client(timeout=timeout, transport=transport) as client:
        body = {"model_path": str(target), "weight_version": str(trainer.version)}
        if pause_mode == "in_place":
            body["flush_cache"] = False
        with _paused(client, engines, pause_mode, stats):
            for url in engines:
                _check(url, client.post(f"{url}/update_weights_from_disk", json=body))
        for url in engines:
            out[url] = _verify(client, url, trainer.version)
    for old in root.iterdir():  # every engine has loaded the new one: drop older exports
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return out


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def push_distributed(
    trainer,
    engines: list[dict],
    *,
    master_address: str,
    master_port: int,
    bucket_bytes: int,
    transport: httpx.BaseTransport | None = None,
    init_group: Callable | None = None,
    broadcast: Callable | None = None,
    timeout: float = 300.0,
    pause_mode: str = "",
    stats: dict | None = None,
    dtype: str = "",
    group_epoch: int = 0,
    previous_group_epoch: int = -1,
    destroy_group: Callable | None = None,
) -> dict[str, str]:
    """``engines``: [{"url", "tp_size"}]. NCCL group: trainer rank 0 + every engine GPU,
    one per ``group_epoch`` (group.py: a restarted trainer or engine gets a new group)."""
    version = str(trainer.version)
    chunks = bucketed(trainer, engine_dtype(trainer.model_dir, dtype), bucket_bytes)
    if trainer.rank != 0:
        for _ in chunks:  # take part in the all-gathers
            pass
        return {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(engines)))
    with httpx.Client(timeout=timeout, transport=transport) as client, pool:
        wg = ensure_group(
            trainer,
            client,
            pool,
            engines,
            epoch=group_epoch,
            previous_epoch=previous_group_epoch,
            master_address=master_address,
            master_port=master_port,
            init_group=init_group or _sglang_group,
            destroy_group=destroy_group,
            check=_check,
        )
        group, name = wg.group, wg.name
        bcast = broadcast or (lambda t, g: torch.distributed.broadcast(t, src=0, group=g))
        flush = pause_mode != "in_place"
        # buckets stream: one bucket of full tensors exists at a time (FSDP all-gathers)
        with _paused(client, [e["url"] for e in engines], pause_mode, stats):
            for chunk, last in _with_last(chunks):
                body = {
                    "names": [n for n, _ in chunk],
                    "dtypes": [_dtype_name(t) for _, t in chunk],
                    "shapes": [list(t.shape) for _, t in chunk],
                    "group_name": name,
                    "flush_cache": flush and last,
                    "weight_version": version,
                }
                futures = [
                    pool.submit(
                        client.post, f"{e['url']}/update_weights_from_distributed", json=body
                    )
                    for e in engines
                ]
                for _, t in chunk:
                    bcast(t, group)
                for e, f in zip(engines, futures, strict=True):
                    _check(e["url"], f.result())
        return {e["url"]: _verify(client, e["url"], trainer.version) for e in engines}


def _with_last(items):
    """(item, is_last) pairs, one item of look-ahead."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


def _sglang_group(master_address: str, master_port: int, world: int, name: str):
    from sglang.srt.utils import init_custom_process_group  # GPU only

    return init_custom_process_group(
        backend="nccl",
        init_method=f"tcp://{master_address}:{master_port}",
        world_size=world,
        rank=0,
        group_name=name,
    )


def engine_target(u: str) -> dict:
    """'URL', 'URL#tp=2' or 'URL#tp=2;gpus=4,5' -> {"url", "tp_size"[, "gpus"]}."""
    url, _, frag = u.partition("#")
    out: dict = {"url": url, "tp_size": 1}
    for part in filter(None, frag.split(";")):
        key, _, value = part.partition("=")
        if key == "tp":
            out["tp_size"] = int(value)
        elif key == "gpus":
            out["gpus"] = [int(g) for g in value.split(",") if g]
        else:
            raise WeightPushError(f"engine target {u!r}: unknown field {key!r} (tp=, gpus=)")
    return out


def push_weights(trainer, req, stats: dict | None = None) -> dict[str, str]:
    """Dispatch an rpc.PushWeights; returns {engine URL: reported version} on rank 0."""
    timeout = trainer.cfg.push_timeout_s
    common = {"timeout": timeout, "pause_mode": req.pause_mode, "stats": stats, "dtype": req.dtype}
    if req.mode == "disk":
        return push_disk(trainer, req.engines, shm_dir=req.shm_dir, **common)
    if req.mode == "lora":  # adapters only (trainer/lora.py); needs trainer.lora
        from spade_async.trainer.lora import push_adapter

        if trainer.cfg.lora is None:
            raise WeightPushError("push mode 'lora' needs trainer.lora (adapters to send)")
        return push_adapter(
            trainer, req.engines, shm_dir=req.shm_dir, timeout=timeout, dtype=req.dtype
        )
    engines = [engine_target(u) for u in req.engines]
    if req.mode == "distributed":
        if not req.master_port:
            raise WeightPushError("push mode 'distributed' needs master_port (a free TCP port)")
        return push_distributed(
            trainer,
            engines,
            master_address=req.master_address,
            master_port=req.master_port,
            bucket_bytes=req.bucket_bytes,
            group_epoch=req.group_epoch,
            previous_group_epoch=req.previous_group_epoch,
            **common,
        )
    if req.mode == "tensor":
        return push_tensor(trainer, engines, bucket_bytes=req.bucket_bytes, **common)
    raise WeightPushError(f"push mode '{req.mode}' is not disk, distributed, tensor or lora")
