"""Controller-side client of the rank-0 trainer RPC.

``TrainerClient`` uses a plain blocking Unix socket and never waits blindly: every receive
has a short socket timeout, and between tries it asks ``alive()`` (the launcher's check of
the torchrun process) whether the trainer still exists, so a dead rank surfaces as
``TrainerDied`` within about a second instead of a hang. ``AsyncTrainerClient`` runs the
same calls in a worker thread for the anyio controller.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

from spade_async.errors import SpadeError
from spade_async.trainer import rpc
from spade_async.trainer.batch import Batch, BatchError

__all__ = ["TrainerClient", "AsyncTrainerClient", "TrainerError", "TrainerDied"]


class TrainerError(SpadeError):
    """The trainer refused a command (the message says why); it keeps serving."""


class TrainerDied(SpadeError):
    """The trainer (a rank, or torchrun) is gone; the message carries its exit and log tail."""


class PushRefused(TrainerError):
    """An engine refused the weight push (``trainer.weights.WeightPushError``): the message
    names the engine, the route and SGLang's answer; every paused engine was continued."""


_ERRORS: dict[str, type[SpadeError]] = {"BatchError": BatchError, "WeightPushError": PushRefused}


class TrainerClient:
    def __init__(
        self,
        socket_path: str,
        *,
        alive: Callable[[], str | None] | None = None,
        connect_timeout: float = 10.0,
        poll_s: float = 0.5,
    ) -> None:
        self.socket_path = socket_path
        self._alive = alive or (lambda: None)
        self._grace_s = 10.0 if alive is not None else 0.0
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._sock = self._connect(connect_timeout)

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except OSError as exc:
                sock.close()
                dead = self._alive()
                if dead:
                    raise TrainerDied(dead) from None
                if time.monotonic() > deadline:
                    raise TrainerDied(
                        f"no trainer answers on {self.socket_path} after {timeout:.0f} s ({exc})"
                    ) from None
                time.sleep(0.1)

    def call(self, req: rpc.Request, *, timeout: float | None = None) -> rpc.Reply:
        """Send one request and wait for its reply; ``timeout`` None waits while alive."""
        with self._lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                rpc.send_frame(self._sock, req)
                reply = self._wait(deadline, type(req).__name__)
            except (ConnectionError, BrokenPipeError) as exc:
                raise TrainerDied(self._why_gone(exc)) from None
        if isinstance(reply, rpc.Failed):
            if reply.fatal:
                raise TrainerDied(f"trainer crashed: {reply.message}")
            raise _ERRORS.get(reply.kind, TrainerError)(reply.message)
        return reply

    def _wait(self, deadline: float | None, what: str) -> rpc.Reply:
        while True:
            readable, _, _ = select.select([self._sock], [], [], self._poll_s)
            if readable:  # read the whole frame blocking; a dying peer gives EOF, not a hang
                return rpc.recv_frame(self._sock, reply=True)
            dead = self._alive()
            if dead:
                raise TrainerDied(dead)
            if deadline is not None and time.monotonic() > deadline:
                raise TrainerDied(f"trainer did not answer {what} in time")

    def _why_gone(self, exc: Exception) -> str:
        """The socket broke: give torchrun a moment to exit so the reason names the rank."""
        deadline = time.monotonic() + self._grace_s
        while True:
            dead = self._alive()
            if dead:
                return dead
            if time.monotonic() >= deadline:
                return f"trainer connection lost ({exc})"
            time.sleep(0.1)

    # -- the API ----------------------------------------------------------------------------
    def ping(self, timeout: float | None = 60.0) -> rpc.Pong:
        return self.call(rpc.Ping(), timeout=timeout)

    def train_step(self, batch: Batch, *, layout: str | None = None) -> dict[str, float]:
        return self.call(rpc.TrainStep(batch, layout)).metrics

    def push_weights(self, engines: list[str], *, mode: str = "disk", **kw) -> rpc.WeightsPushed:
        return self.call(rpc.PushWeights(engines=list(engines), mode=mode, **kw))

    def save(self, directory: str, *, hf_directory: str = "") -> rpc.Saved:
        return self.call(rpc.Save(directory=str(directory), hf_directory=str(hf_directory)))

    def load(self, directory: str) -> rpc.Loaded:
        return self.call(rpc.Load(str(directory)))

    def export_hf(self, directory: str) -> rpc.Saved:
        return self.call(rpc.ExportHF(str(directory)))

    def shutdown(self, timeout: float = 60.0) -> None:
        try:
            self.call(rpc.Shutdown(), timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        self._sock.close()


class AsyncTrainerClient:
    """The same API for anyio code: each call runs in a worker thread (abandon on cancel)."""

    def __init__(self, client: TrainerClient) -> None:
        self.sync = client

    async def _run(self, fn, *args, **kw):
        import functools

        import anyio

        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kw), abandon_on_cancel=True
        )

    async def train_step(self, batch: Batch) -> dict[str, float]:
        return await self._run(self.sync.train_step, batch)

    async def push_weights(self, engines: list[str], **kw) -> rpc.WeightsPushed:
        return await self._run(self.sync.push_weights, engines, **kw)

    async def save(self, directory: str, **kw) -> rpc.Saved:
        return await self._run(self.sync.save, directory, **kw)

    async def load(self, directory: str) -> rpc.Loaded:
        return await self._run(self.sync.load, directory)

    async def ping(self) -> rpc.Pong:
        return await self._run(self.sync.ping)
