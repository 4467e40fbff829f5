"""Export part: the trainer's ``push_tensor`` path into an engine process on the same device.

The engine is a spawned child process standing in for a colocated SGLang engine: it
receives each bucket as SGLang would (a string of pickled CUDA IPC handles, torch's
multiprocessing reductions), copies the tensors into its own bf16 weights and reports the
weight version. ``weights.push_tensor`` runs unchanged; only its HTTP transport
(``httpx.MockTransport`` forwarding each request over a pipe to the child) and its
serializer (ForkingPickler, what SGLang's MultiprocessingSerializer does) are supplied
here. After the pushes the child's per-tensor sums must equal the trainer's (in bf16).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import time
import types
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as mp


def ipc_serialize(chunk: list[tuple[str, torch.Tensor]]) -> str:
    """Pickled handles (CUDA IPC / shared memory), never the data (``payload_bytes`` shows it)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    plain = [(n, t.wait() if isinstance(t, AsyncCollectiveTensor) else t) for n, t in chunk]
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(plain)
    return base64.b64encode(buf.getvalue()).decode()


def engine_main(conn, device: str) -> None:
    """Child: apply 'update' buckets into bf16 weights; answer 'version' and 'sums'."""
    if device == "cuda":
        torch.cuda.set_device(0)
    weights: dict[str, torch.Tensor] = {}
    version = None
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            conn.send("bye")
            return
        if msg[0] == "version":
            conn.send(version)
        elif msg[0] == "sums":
            conn.send({k: float(v.double().sum()) for k, v in weights.items()})
        elif msg[0] == "update":
            chunk = pickle.loads(base64.b64decode(msg[1]))
            n = 0
            for name, t in chunk:
                dst = weights.get(name)
                if dst is None:
                    dst = weights[name] = torch.empty(
                        t.shape, dtype=torch.bfloat16, device=t.device
                    )
                dst.copy_(t)
                n += t.numel() * t.element_size()
            if device == "cuda":
                torch.cuda.synchronize()
            del chunk
            version = msg[2]
            conn.send(n)


def _transport(conn, stats: dict):
    import httpx

    from spade_async.generation.sglang_state import SGLangState, apply

    state = SGLangState()  # SGLang 0.5.23's session rule: updates only between begin/end

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/begin_weight_update", "/end_weight_update"):
            v = apply(state, path, {})
            return httpx.Response(v.status, json=v.body())
        if path == "/update_weights_from_tensor":
            if state.session is None:
                v = apply(state, path, {})
                return httpx.Response(v.status, json=v.body())
            body = json.loads(request.content)
            stats["payload_bytes"] += len(body["serialized_named_tensors"][0])
            t0 = time.perf_counter()
            conn.send(("update", body["serialized_named_tensors"][0], body["weight_version"]))
            stats["bytes"] += conn.recv()
            stats["engine_s"] += time.perf_counter() - t0
            stats["buckets"] += 1
            return httpx.Response(200, json={"success": True})
        if path == "/model_info":  # SGLang 0.5.23 reports the weight version here
            conn.send(("version",))
            return httpx.Response(200, json={"weight_version": conn.recv()})
        if path in ("/pause_generation", "/continue_generation"):
            stats["pause_calls"] += 1
            return httpx.Response(200, json={"success": True})
        return httpx.Response(404, json={"success": False, "message": f"no route {path}"})

    return httpx.MockTransport(handle)


def _fallback_trainer(ctx: dict):
    """When the trainer part failed: a bf16 PolicyModel of the same shape, unsharded."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from spade_async.trainer.model import PolicyModel

    config = Qwen3Config(**ctx["sizes"]["trainer"]["model"])
    with torch.device(ctx["device"]):
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return types.SimpleNamespace(model=PolicyModel(lm, 1.0), rank=0, version=1, model_dir="")


def export_part(ctx: dict, result: dict) -> None:
    from spade_async.trainer.weights import push_tensor

    device, cfg, log = ctx["device"], ctx["sizes"]["export"], ctx["log"]
    trainer = ctx.get("trainer")
    result["source"] = "trainer (FSDP2 fp32 masters)" if trainer else "fallback bf16 model"
    if trainer is None:
        trainer = _fallback_trainer(ctx)
    spawn = mp.get_context("spawn")
    parent, child = spawn.Pipe()
    t0 = time.perf_counter()
    proc = spawn.Process(target=engine_main, args=(child, device), daemon=True)
    proc.start()
    try:
        pushes = []
        for i in range(cfg["pushes"]):
            stats = {
                "bytes": 0,
                "payload_bytes": 0,
                "engine_s": 0.0,
                "buckets": 0,
                "pause_calls": 0,
            }
            trainer.version += 0 if i == 0 else 1
            t1 = time.perf_counter()
            got = push_tensor(
                trainer,
                [{"url": "http://engine", "tp_size": 1}],
                bucket_bytes=cfg["bucket_mib"] << 20,
                transport=_transport(parent, stats),
                serialize=ipc_serialize,
                pause_mode="in_place",
                stats=stats,
                dtype="bfloat16",  # what the stand-in engine holds
            )
            secs = time.perf_counter() - t1
            pushes.append(
                {
                    "seconds": round(secs, 3),
                    "bytes": stats["bytes"],
                    "payload_bytes": stats["payload_bytes"],
                    "gb_per_s": round(stats["bytes"] / secs / 1e9, 2),
                    "buckets": stats["buckets"],
                    "engine_apply_s": round(stats["engine_s"], 3),
                    "paused_s": round(stats.get("paused_s", 0.0), 3),
                    "engine_version": got.get("http://engine"),
                }
            )
            log(f"export: push {i} {pushes[-1]}")
        result["pushes"] = pushes
        result["note"] = "push 0 includes the child's CUDA start and its weight allocation"
        parent.send(("sums",))
        engine_sums = parent.recv()
        from spade_async.trainer.stream import bucketed

        mine = {
            n: float(t.double().sum())
            for bucket in bucketed(trainer, torch.bfloat16, 512 << 20)
            for n, t in bucket
        }
        result["tensors"] = len(mine)
        result["weights_match"] = engine_sums.keys() == mine.keys() and all(
            engine_sums[k] == mine[k] for k in mine
        )
        parent.send(("stop",))
        parent.recv()
    finally:
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
        result["child_exit"] = proc.exitcode
        result["total_s"] = round(time.perf_counter() - t0, 2)
    if not result["weights_match"]:
        raise RuntimeError("engine weights differ from the trainer's after the push")
