"""Push the trainer's weights to generation engines; the engine must then report our version.

Three paths, one per engine placement (every rank calls ``push_weights``; only rank 0 talks
HTTP):

- ``disk`` (CPU engine, or any SGLang): export HF safetensors into a shared-memory (or temp)
  directory, ``POST /update_weights_from_disk {"model_path", "weight_version"}``, then
  ``GET /model_info`` must report the trainer's ``weight_version``. The previous export is
  removed once every engine has moved on.
- ``distributed`` (SGLang on other GPUs): once, ``POST /init_weights_update_group`` to each
  engine while rank 0 joins the same NCCL group as rank 0 (engines take ranks
  1..sum(tp)); then per bucket of parameters (``bucket_bytes``), ``POST
  /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name",
  "flush_cache", "weight_version"}`` in a thread while rank 0 broadcasts each tensor.
- ``tensor`` (SGLang colocated on the same GPUs): per bucket, CUDA IPC handles serialised
  with SGLang's ``MultiprocessingSerializer`` in ``POST /update_weights_from_tensor``.

With ``pause_mode`` set (the async schedule: generation is in flight), rank 0 pauses the
engines (``/pause_generation``) only around the engine-side update (the disk export happens
before, while they keep generating) and continues them after (``/continue_generation``);
``stats["paused_s"]`` reports how long. Paused ``in_place``, running requests keep their KV
cache, so the updates carry ``flush_cache: false`` (SGLang refuses to flush then).

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
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import torch

from spade_async.errors import SpadeError
from spade_async.trainer.checkpoint import PREFIX, export_hf

__all__ = [
    "WeightPushError",
    "push_weights",
    "push_disk",
    "push_distributed",
    "push_tensor",
    "buckets",
]

GROUP = "spade_weight_update"


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
) -> dict[str, str]:
    root = _shm_root(shm_dir) / f"spade-weights-{os.getppid()}"
    target = root / f"v{trainer.version}"
    export_hf(trainer, target)  # engines keep generating meanwhile
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


def _named_full_tensors(trainer) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) on every rank, one parameter at a time (FSDP all-gather)."""
    tied = getattr(trainer.model.causal_lm.config, "tie_word_embeddings", False)
    for name, p in trainer.model.named_parameters():
        hf = name.removeprefix(PREFIX)
        if tied and hf == "lm_head.weight":
            continue
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield hf, full.detach()


def buckets(named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int):
    bucket, size = [], 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


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
) -> dict[str, str]:
    """``engines``: [{"url", "tp_size"}]. NCCL group: trainer rank 0 + every engine GPU."""
    version = str(trainer.version)
    named = _named_full_tensors(trainer)
    if trainer.rank != 0:
        for _ in named:  # take part in the all-gathers
            pass
        return {}
    world = 1 + sum(e["tp_size"] for e in engines)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(engines)))
    with httpx.Client(timeout=timeout, transport=transport) as client, pool:
        group = getattr(trainer, "_weight_group", None)
        if group is None:
            offset, futures = 1, []
            for e in engines:
                body = {
                    "master_address": master_address,
                    "master_port": master_port,
                    "rank_offset": offset,
                    "world_size": world,
                    "group_name": GROUP,
                    "backend": "nccl",
                }
                futures.append(
                    pool.submit(client.post, f"{e['url']}/init_weights_update_group", json=body)
                )
                offset += e["tp_size"]
            group = (init_group or _sglang_group)(master_address, master_port, world)
            for e, f in zip(engines, futures, strict=True):
                _check(e["url"], f.result())
            trainer._weight_group = group
        bcast = broadcast or (lambda t, g: torch.distributed.broadcast(t, src=0, group=g))
        flush = pause_mode != "in_place"
        # buckets stream: one bucket of full tensors exists at a time (FSDP all-gathers)
        with _paused(client, [e["url"] for e in engines], pause_mode, stats):
            for chunk, last in _with_last(buckets(named, bucket_bytes)):
                body = {
                    "names": [n for n, _ in chunk],
                    "dtypes": [_dtype_name(t) for _, t in chunk],
                    "shapes": [list(t.shape) for _, t in chunk],
                    "group_name": GROUP,
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


def _sglang_group(master_address: str, master_port: int, world: int):
    from sglang.srt.utils import init_custom_process_group  # GPU only

    return init_custom_process_group(
        backend="nccl",
        init_method=f"tcp://{master_address}:{master_port}",
        world_size=world,
        rank=0,
        group_name=GROUP,
    )


def push_tensor(
    trainer,
    engines: list[dict],
    *,
    bucket_bytes: int,
    transport: httpx.BaseTransport | None = None,
    serialize: Callable | None = None,
    timeout: float = 300.0,
    pause_mode: str = "",
    stats: dict | None = None,
) -> dict[str, str]:
    """Colocated: ``engines`` [{"url", "tp_size"}] share this GPU; tensors go as IPC handles."""
    named = _named_full_tensors(trainer)
    if trainer.rank != 0:
        for _ in named:
            pass
        return {}
    ser = serialize or _sglang_serialize
    flush = pause_mode != "in_place"
    with (
        httpx.Client(timeout=timeout, transport=transport) as client,
        _paused(client, [e["url"] for e in engines], pause_mode, stats),
    ):
        for chunk, last in _with_last(buckets(named, bucket_bytes)):
            payload = ser(chunk)
            for e in engines:
                body = {
                    "serialized_named_tensors": [payload] * e["tp_size"],
                    "flush_cache": flush and last,
                    "weight_version": str(trainer.version),
                }
                _check(e["url"], client.post(f"{e['url']}/update_weights_from_tensor", json=body))
        return {e["url"]: _verify(client, e["url"], trainer.version) for e in engines}


def _sglang_serialize(chunk: list[tuple[str, torch.Tensor]]) -> str:
    from sglang.srt.utils import MultiprocessingSerializer  # GPU only

    return MultiprocessingSerializer.serialize(chunk, output_str=True)


def push_weights(trainer, req, stats: dict | None = None) -> dict[str, str]:
    """Dispatch an rpc.PushWeights; returns {engine URL: reported version} on rank 0."""
    timeout = trainer.cfg.push_timeout_s
    common = {"timeout": timeout, "pause_mode": req.pause_mode, "stats": stats}
    if req.mode == "disk":
        return push_disk(trainer, req.engines, shm_dir=req.shm_dir, **common)
    engines = [
        {"url": u, "tp_size": 1}
        if "#tp=" not in u
        else {"url": u.split("#tp=")[0], "tp_size": int(u.split("#tp=")[1])}
        for u in req.engines
    ]
    if req.mode == "distributed":
        if not req.master_port:
            raise WeightPushError("push mode 'distributed' needs master_port (a free TCP port)")
        return push_distributed(
            trainer,
            engines,
            master_address=req.master_address,
            master_port=req.master_port,
            bucket_bytes=req.bucket_bytes,
            **common,
        )
    if req.mode == "tensor":
        return push_tensor(trainer, engines, bucket_bytes=req.bucket_bytes, **common)
    raise WeightPushError(f"push mode '{req.mode}' is not disk, distributed or tensor")
