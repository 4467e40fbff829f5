"""Push the trainer's weights to generation engines; the engine must then report our version.

Three paths, one per engine placement (every rank calls ``push_weights``; only rank 0 talks
HTTP):

- ``disk`` (CPU engine, or any SGLang): export HF safetensors (streamed shards) into a shared-memory (or temp)
  directory, ``POST /update_weights_from_disk {"model_path", "weight_version"}``, then
  ``GET /model_info`` must report the trainer's ``weight_version``. The previous export is
  removed once every engine has moved on.
- ``distributed`` (SGLang on other GPUs): once, ``POST /init_weights_update_group`` to each
  engine while rank 0 joins the same NCCL group as rank 0 (engines take ranks
  1..sum(tp)); then, inside a weight-update session (``POST /begin_weight_update`` ..
  ``/end_weight_update``: SGLang 0.5.23 refuses the update outside one), per bucket of
  parameters (``bucket_bytes``), ``POST /update_weights_from_distributed {"names",
  "dtypes", "shapes", "group_name", "flush_cache", "weight_version", "load_format":
  "flattened_bucket"}`` in a thread while rank 0 broadcasts the bucket as one uint8 tensor
  (SGLang's ``FlattenedTensorBucket`` layout). An engine that answers before the broadcast
  completes has refused and will never join it: the push ends at once, and at
  ``push_timeout_s`` at the latest.
- ``tensor`` (SGLang colocated on the same GPUs): in a session too, per bucket, CUDA IPC
  handles serialised with SGLang's ``MultiprocessingSerializer`` after its
  ``monkey_patch_torch_reductions`` (device UUIDs) in ``POST /update_weights_from_tensor``,
  one payload per engine TP rank from the trainer rank on that GPU (ipc.py).

With ``pause_mode`` set (the async schedule: generation is in flight), rank 0 pauses the
engines (``/pause_generation``) only around the engine-side update (the disk export happens
before, while they keep generating) and continues them after (``/continue_generation``);
``stats["paused_s"]`` reports how long. Paused ``in_place``, running requests keep their KV
cache, so the updates carry ``flush_cache: false`` (SGLang refuses to flush then). Every
engine a pause or a session was opened on is continued / closed whatever fails, and a
refusal anywhere is one ``WeightPushError`` naming the engine, the route and SGLang's
message (``sglang_state.py`` models what SGLang refuses).

Every path sends the weights in the engine's dtype (``PushWeights.dtype``; '' = what the
engine serves, see ``stream.engine_dtype``), one bucket of full tensors at a time, each cast
on its shard before the all-gather: never an fp32 copy of the whole model (stream.py).

The GPU paths follow SGLang's documented HTTP API and are contract-tested on CPU (the
requests they send, with fake transports); they have not been run against a GPU here.
Side effects: importing SGLang (GPU paths only) sets multiprocessing to spawn.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
from collections.abc import Callable

import httpx
import torch

from spade_async.trainer.group import ensure_group
from spade_async.trainer.ipc import push_tensor
from spade_async.trainer.push_common import (
    WeightPushError,
    check_reply,
    paused,
    post,
    session,
    shm_root,
    verify_version,
    with_last,
)
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
    root = shm_root(shm_dir) / f"spade-weights-{os.getppid()}"
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
        with paused(client, engines, pause_mode, stats):  # no session: SGLang's disk
            for url in engines:  # update needs none (sglang_state.SESSION_ROUTES)
                post(client, url, "/update_weights_from_disk", body)
        for url in engines:
            out[url] = verify_version(client, url, trainer.version)
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
            check=check_reply,
        )
        group, name = wg.group, wg.name
        bcast = broadcast or _nccl_broadcast
        flush = pause_mode != "in_place"
        urls = [e["url"] for e in engines]
        deadline = time.monotonic() + timeout
        # buckets stream: one bucket of full tensors exists at a time (FSDP all-gathers)
        it = with_last(chunks)
        try:
            with paused(client, urls, pause_mode, stats), session(client, urls):
                for chunk, last in it:
                    parts = flat_buckets(chunk)
                    for j, part in enumerate(parts):
                        names = [n for n, _ in part]
                        body = {
                            "names": names,
                            "dtypes": [_dtype_name(t) for _, t in part],
                            "shapes": [list(t.shape) for _, t in part],
                            "group_name": name,
                            "flush_cache": flush and last and j == len(parts) - 1,
                            "weight_version": version,
                            "load_format": "flattened_bucket",
                        }
                        route = "/update_weights_from_distributed"
                        futures = [pool.submit(client.post, f"{u}{route}", json=body) for u in urls]
                        flat = flatten(part)  # SGLang's FlattenedTensorBucket layout
                        _broadcast_watching(bcast(flat, group), futures, urls, deadline, names)
                        for u, f in zip(urls, futures, strict=True):
                            check_reply(u, _result(f, u, route, deadline))
        except BaseException:
            wg.epoch = -2  # a broken bucket may leave the group mid-collective: a new one
            for _ in it:  # the other ranks' all-gathers still need this rank
                pass
            raise
        return {u: verify_version(client, u, trainer.version) for u in urls}


def flat_buckets(chunk: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    """``chunk`` cut where a tensor would start at a byte offset its dtype cannot view:
    SGLang's ``FlattenedTensorBucket.empty`` (weight_sync/tensor_bucket.py) refuses an
    unaligned one. One dtype (the usual case) is one part."""
    parts: list[list[tuple[str, torch.Tensor]]] = [[]]
    offset = 0
    for name, t in chunk:
        if offset % t.element_size():
            parts.append([])
            offset = 0
        parts[-1].append((name, t))
        offset += t.numel() * t.element_size()
    return [p for p in parts if p]


def flatten(part: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """One uint8 tensor: each tensor's bytes in order, as ``FlattenedTensorBucket``
    (weight_sync/tensor_bucket.py) builds it and ``FlattenedTensorBucket.empty`` receives
    it (``names``/``dtypes``/``shapes`` give the receiver its metadata)."""
    return torch.cat([t.contiguous().flatten().view(torch.uint8) for _, t in part])


def _nccl_broadcast(t: torch.Tensor, group):
    return torch.distributed.broadcast(t, src=0, group=group, async_op=True)


def _broadcast_watching(work, futures, urls, deadline: float, names: list[str]) -> None:
    """Wait for the bucket's broadcast, watching the engines' answers: an engine that
    answers before joining it (a refusal) never will, so its answer ends the wait at once;
    past ``deadline`` (push_timeout_s) the push fails instead of hanging."""
    if work is None:  # a synchronous broadcast (tests): done
        return
    while not work.is_completed():
        for u, f in zip(urls, futures, strict=True):
            if f.done():
                resp = f.result()
                check_reply(u, resp)  # a refusal raises; a success comes after the broadcast
        if time.monotonic() > deadline:
            raise WeightPushError(
                f"NCCL broadcast of {len(names)} tensors ({names[0]}, ...) not received by "
                f"{', '.join(urls)} within push_timeout_s"
            )
        time.sleep(0.002)


def _result(future, url: str, route: str, deadline: float) -> httpx.Response:
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        raise WeightPushError(
            f"engine {url}: POST {route} unanswered within push_timeout_s"
        ) from None
    except httpx.HTTPError as exc:
        raise WeightPushError(
            f"engine {url}: POST {route} failed ({type(exc).__name__}: {exc})"
        ) from None


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
            trainer,
            req.engines,
            shm_dir=req.shm_dir,
            timeout=timeout,
            dtype=req.dtype,
            keep=req.lora_keep,
            taken=req.lora_taken,
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
