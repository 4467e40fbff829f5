"""Colocated weight push: CUDA IPC handles, one payload per SGLang tensor-parallel rank.

SGLang 0.5.23's ``/update_weights_from_tensor`` takes ``serialized_named_tensors`` as a
list indexed by TP rank: TP rank k deserialises only entry k
(``TpModelWorker.deserialize_own_rank``), and each entry must be a serialisation of its own,
or the producer's CUDA-IPC reference counts break (``Engine._serialize_tensors_per_rank``
serialises once per rank for that reason).

Here each entry also points at memory on the GPU its TP rank runs on: every trainer rank
holds the full bucket after the FSDP all-gather, so the trainer rank on GPU g serialises
the handles for the engine TP ranks on GPU g; rank 0 serialises those whose GPU hosts no
trainer rank (their engine then reads over NVLink, as with SGLang's own Engine API). Rank 0
gathers the payloads (``gather_object`` on the control group), posts one request per engine
and every rank keeps its bucket alive until the engines have loaded it (a barrier).

Contract-tested on CPU (fake serializer, fake gather); not run on a GPU here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import httpx

from spade_async.trainer.push_common import (
    WeightPushError,
    check_reply,
    paused,
    session,
    verify_version,
    with_last,
)

__all__ = ["my_gpu", "tp_assignment", "push_tensor"]


def my_gpu(trainer) -> int:
    """This rank's physical GPU id (CUDA_VISIBLE_DEVICES maps the local index); -1 on CPU."""
    dev = getattr(trainer, "device", None)
    if dev is None or dev.type != "cuda":
        return -1
    index = dev.index or 0
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[index]) if index < len(visible) else index


def tp_assignment(engine_gpus: list[list[int]], rank_gpus: list[int]) -> dict[tuple[int, int], int]:
    """{(engine index, TP rank): trainer rank that serialises its payload}: the trainer rank
    on the same GPU, else rank 0. ``rank_gpus[r]`` is trainer rank r's GPU."""
    owner = {}
    for r, g in enumerate(rank_gpus):
        owner.setdefault(g, r)
    return {
        (e, k): owner.get(g, 0) for e, gpus in enumerate(engine_gpus) for k, g in enumerate(gpus)
    }


def _default_collectives(trainer):
    """(gather to rank 0, all-gather) of picklable objects over the control group."""
    import torch.distributed as dist

    if not getattr(trainer, "distributed", False):
        return (lambda obj: [obj]), (lambda obj: [obj])
    group = trainer.control_group

    def gather(obj):
        out = [None] * trainer.world if trainer.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=group)
        return out

    def all_gather(obj):
        out = [None] * trainer.world
        dist.all_gather_object(out, obj, group=group)
        return out

    return gather, all_gather


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
    dtype: str = "",
    collectives: tuple[Callable, Callable] | None = None,
) -> dict[str, str]:
    """``engines``: [{"url", "tp_size", "gpus"}] sharing the trainer's GPUs ("gpus": the
    engine's GPU ids, TP rank order; absent = TP ranks 0.. on the trainer ranks' GPUs).

    ``collectives`` = (gather to rank 0, all-gather) over the trainer ranks; the default
    uses the control group (tests pass fakes). Rank 0 returns {URL: version}, others {}."""
    from spade_async.trainer.stream import bucketed, engine_dtype

    gather, all_gather = collectives or _default_collectives(trainer)
    rank_gpus = all_gather(my_gpu(trainer))
    engine_gpus = [
        list(
            e.get("gpus")
            or [rank_gpus[k] if k < len(rank_gpus) else -1 for k in range(e["tp_size"])]
        )
        for e in engines
    ]
    for e, gpus in zip(engines, engine_gpus, strict=True):
        if len(gpus) != e["tp_size"]:
            raise WeightPushError(
                f"engine {e['url']}: {len(gpus)} GPU ids for tp_size {e['tp_size']}"
            )
    assign = tp_assignment(engine_gpus, rank_gpus)
    mine = [key for key, r in assign.items() if r == trainer.rank]
    ser = serialize or _sglang_serialize
    chunks = bucketed(trainer, engine_dtype(trainer.model_dir, dtype), bucket_bytes)
    flush = pause_mode != "in_place"
    client = httpx.Client(timeout=timeout, transport=transport) if trainer.rank == 0 else None
    urls = [e["url"] for e in engines]
    error = ""
    try:
        with contextlib.ExitStack() as stack:
            if client is not None:
                try:  # pause, then SGLang's weight-update session (refused outside one)
                    stack.enter_context(paused(client, urls, pause_mode, stats))
                    stack.enter_context(session(client, urls))
                except WeightPushError as exc:
                    error = str(exc)  # the other ranks still meet rank 0 in the first bucket
            for chunk, last in with_last(chunks):
                # one serialisation per TP rank, of this rank's own copy of the bucket
                payloads = gather({key: ser(chunk) for key in mine})
                if client is not None and not error:
                    error = _post_bucket(client, engines, payloads, flush and last, trainer)
                # every rank keeps its bucket until the engines have read every handle, and
                # learns whether rank 0 goes on (a refused bucket stops all ranks together)
                error = all_gather(error)[0]
                if error:
                    break
            if client is None:
                return {}
            if error:  # ending the sessions and continuing the engines may add to it
                try:
                    stack.close()
                except WeightPushError as exc:
                    error = str(exc)
                raise WeightPushError(error)
        # sessions ended and engines continued (a failure there raised): check versions
        return {url: verify_version(client, url, trainer.version) for url in urls}
    finally:
        if client is not None:
            client.close()


def _post_bucket(client, engines, payloads, flush: bool, trainer) -> str:
    """POST one bucket to every engine; '' or the first refusal's one line."""

    try:
        got = {k: v for part in payloads for k, v in part.items()}
        for i, e in enumerate(engines):
            body = {
                "serialized_named_tensors": [got[(i, k)] for k in range(e["tp_size"])],
                "flush_cache": flush,
                "weight_version": str(trainer.version),
            }
            check_reply(e["url"], client.post(f"{e['url']}/update_weights_from_tensor", json=body))
    except (httpx.HTTPError, WeightPushError) as exc:
        return str(exc) or type(exc).__name__
    return ""


def _sglang_serialize(chunk) -> str:
    """SGLang's serialisation of a bucket for ``/update_weights_from_tensor``: its
    ``monkey_patch_torch_reductions`` (utils/patch_torch.py) first, so each CUDA handle
    carries its device's UUID, not this process's device index (engine 1 of
    ``[[0-3],[4-7]]`` sees 4 devices: index 4+k is no device there, the UUID maps to k);
    the receiving scheduler applies the same patch before it deserialises."""
    from sglang.srt.utils import MultiprocessingSerializer  # GPU only
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    monkey_patch_torch_reductions()  # idempotent: patched once per process
    return MultiprocessingSerializer.serialize(chunk, output_str=True)
