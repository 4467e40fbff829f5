"""Rank-0 RPC over a Unix socket: msgspec (msgpack) frames, one request at a time.

Frame: 8-byte big-endian length, then a msgpack-encoded tagged ``Request`` or ``Reply``.
Rank 0 serves; each command it accepts is broadcast to the other ranks (gloo control group)
so all ranks run the same calls in lockstep. A batch is validated on rank 0 first: a bad one
is answered with ``Failed`` and no rank steps. Plain blocking sockets: the trainer never
imports anyio (the controller's async wrapper lives in client.py).
"""

from __future__ import annotations

import os
import socket
import struct
import traceback
from collections.abc import Callable
from typing import Literal

import msgspec
import torch.distributed as dist

from spade_async.errors import SpadeError
from spade_async.trainer.batch import Batch, BatchError, validate_batch

__all__ = [
    "Ping",
    "TrainStep",
    "PushWeights",
    "Save",
    "Load",
    "ExportHF",
    "Shutdown",
    "Request",
    "Pong",
    "StepDone",
    "WeightsPushed",
    "Saved",
    "Loaded",
    "Done",
    "Failed",
    "Reply",
    "send_frame",
    "recv_frame",
    "serve",
]


class Ping(msgspec.Struct, tag=True, frozen=True):
    pass


class TrainStep(msgspec.Struct, tag=True, frozen=True):
    batch: Batch
    # override cfg.packing for this step (benchmarks): see trainer.packing.LAYOUTS
    layout: Literal["packed", "padded", "padded_max", "padded_sorted"] | None = None


class PushWeights(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    engines: list[str]  # base URLs, e.g. http://127.0.0.1:30000
    mode: str = "disk"  # disk | distributed | tensor | lora (adapters only; see weights.py)
    shm_dir: str = ""  # where disk mode writes the export ('' = /dev/shm or the temp dir)
    master_address: str = "127.0.0.1"  # distributed mode: the NCCL group's rendezvous
    master_port: int = 0
    bucket_bytes: int = 512 << 20
    # pause the engines around the engine-side update ('' = no pause: nothing in flight)
    pause_mode: Literal["", "in_place", "abort", "retract"] = ""
    # the engine's weight dtype ('' = what SGLang's --dtype auto serves; see stream.py)
    dtype: str = ""
    # distributed mode: the weight group's number (a new one after any restart, group.py)
    # and the previous push's (-1 = none), whose group the engines are asked to drop
    group_epoch: int = 0
    previous_group_epoch: int = -1
    # lora mode: adapter names loaded on some engine (the new one avoids them), and how
    # many previous adapters the trainer keeps loaded (< 0: none unloaded; the loop does)
    lora_taken: list[str] = []
    lora_keep: int = 1


class Save(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    directory: str
    hf_directory: str = ""  # also export HF safetensors here when set


class Load(msgspec.Struct, tag=True, frozen=True):
    directory: str


class ExportHF(msgspec.Struct, tag=True, frozen=True):
    directory: str


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    pass


Request = Ping | TrainStep | PushWeights | Save | Load | ExportHF | Shutdown


class Pong(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    world_size: int
    pids: list[int]
    version: int
    step: int
    device: str


class StepDone(msgspec.Struct, tag=True, frozen=True):
    metrics: dict[str, float]


class WeightsPushed(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    version: int
    engines: dict[str, str]  # URL -> the weight version that engine reports after the push
    seconds: float
    paused_s: float = 0.0  # how long generation was paused for it (pause_mode set)


class Saved(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    directory: str
    version: int


class Loaded(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    step: int
    version: int


class Done(msgspec.Struct, tag=True, frozen=True):
    pass


class Failed(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    kind: str  # exception class name, e.g. BatchError, CheckpointError, WeightPushError
    message: str
    fatal: bool = False  # the trainer is exiting after this reply


Reply = Pong | StepDone | WeightsPushed | Saved | Loaded | Done | Failed

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_HEADER = struct.Struct(">Q")


def send_frame(sock: socket.socket, msg: msgspec.Struct) -> None:
    payload = _encoder.encode(msg)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, *, reply: bool) -> Request | Reply:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    data = _recv_exact(sock, n)
    return (_reply_decoder if reply else _request_decoder).decode(data)


def decode_request(data: bytes) -> Request:
    return _request_decoder.decode(data)


def _broadcast(data: bytes | None, group) -> bytes:
    """Rank 0's bytes to every rank (no-op without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        assert data is not None
        return data
    box = [data]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def follow(execute: Callable[[Request], Reply], group) -> None:
    """Ranks > 0: run every command rank 0 broadcasts until Shutdown."""
    while True:
        req = decode_request(_broadcast(None, group))
        try:
            execute(req)
        except SpadeError:
            pass  # rank 0 hits the same refusal and reports it
        if isinstance(req, Shutdown):
            return


def serve(socket_path: str, execute: Callable[[Request], Reply], vocab_size: int, group) -> None:
    """Rank 0: accept clients one at a time, run their requests on all ranks, reply."""
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path + ".tmp")
    os.rename(socket_path + ".tmp", socket_path)  # appears only once it is bound
    server.listen(4)
    try:
        while True:
            conn, _ = server.accept()
            with conn:
                if _session(conn, execute, vocab_size, group):
                    return
    finally:
        server.close()
        if os.path.exists(socket_path):
            os.unlink(socket_path)


def _session(conn: socket.socket, execute, vocab_size: int, group) -> bool:
    """Serve one client; True once a Shutdown has run."""
    while True:
        try:
            req = recv_frame(conn, reply=False)
        except (ConnectionError, OSError):
            return False
        except msgspec.DecodeError as exc:
            send_frame(conn, Failed(kind="DecodeError", message=f"bad request frame: {exc}"))
            continue
        if isinstance(req, TrainStep):
            try:
                validate_batch(req.batch, vocab_size)
            except BatchError as exc:
                send_frame(conn, Failed(kind="BatchError", message=str(exc)))
                continue
        _broadcast(_encoder.encode(req), group)
        try:
            reply = execute(req)
        except SpadeError as exc:  # a refused command: reported, the trainer keeps serving
            reply = Failed(kind=type(exc).__name__, message=str(exc))
        except BaseException as exc:
            msg = "".join(traceback.format_exception_only(exc)).strip()
            _try_send(conn, Failed(kind=type(exc).__name__, message=msg, fatal=True))
            raise
        _try_send(conn, reply)
        if isinstance(req, Shutdown):
            return True


def _try_send(conn: socket.socket, msg: msgspec.Struct) -> None:
    try:
        send_frame(conn, msg)
    except OSError:
        pass  # the client went away; the command still ran on every rank
