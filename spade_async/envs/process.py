"""One sandboxed worker process seen from the parent: boot, request/reply, kill.

The hot path is one ``os.write`` of a length-prefixed msgpack frame to a non-blocking
pipe and one ``os.read`` of the reply, waiting with ``anyio.wait_readable`` only when the
reply is not there yet. One request is in flight per worker (an ``anyio.Lock``). Any
failure in the middle of a round trip (our timeout, a cancelled caller, a broken frame,
EOF) kills the worker's whole process group: its state can no longer be trusted. So does a
reply the parent refuses (``replies.check``: wrong type or request number, an unsolicited
frame, a value outside the contract): the parent decides, never the worker.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import anyio
import msgspec

from spade_async import failure
from spade_async.envs import protocol as P
from spade_async.envs import replies, sandbox, tasks

_READ_CHUNK = 1 << 16  # bytes per read of a reply pipe (a pipe holds 64 KiB)
_MMAP_THRESHOLD = 256 << 10
_mmap_fixed: bool | None = None


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``) for this process, once.

    A reply frame may be megabytes (up to ``4 x max_obs_chars``). glibc serves such a buffer
    with mmap, and when it is freed raises its threshold to the buffer's size (the dynamic
    threshold), so later buffers below that size come from the heap, whose top rarely
    shrinks: over hours of hostile environments the controller's RSS climbs in steps. A
    fixed threshold keeps big buffers mmapped and returned at free (what setting
    ``MALLOC_MMAP_THRESHOLD_`` does; that variable, when set, is left alone). Linux/glibc
    only; elsewhere a no-op (False)."""
    global _mmap_fixed
    if _mmap_fixed is None:
        _mmap_fixed = False
        if sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            try:
                mallopt = ctypes.CDLL(None).mallopt  # glibc; musl has none
                _mmap_fixed = bool(mallopt(-3, _MMAP_THRESHOLD))  # M_MMAP_THRESHOLD = -3
            except (OSError, AttributeError):
                pass
    return _mmap_fixed


class EnvError(Exception):
    """A classified failure of environment code; callers turn it into data.

    ``kind`` is one of ``protocol.ERROR_KINDS`` (timeout, crash, memory, output_too_large,
    exception, contract, structure, lost, busy, boot, protocol).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


_ENCODER = msgspec.msgpack.Encoder()
_serial = itertools.count(1)
_DECODER = replies.decoder()


def _read_available(fd: int, limit: int = 64 << 10) -> str:
    """What a non-blocking pipe holds now (at most ``limit`` bytes), decoded."""
    data = b""
    while len(data) < limit:
        try:
            chunk = os.read(fd, limit - len(data))
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def _exit_reason(rc: int) -> tuple[str, str]:
    """(kind, text) for a dead worker's exit status (bwrap reports a signal as 128+N)."""
    sig = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        kind = "timeout" if sig == signal.SIGXCPU else "crash"
        return kind, f"worker died with signal {name}"
    return "crash", f"worker exited with status {rc}"


class WorkerProcess:
    def __init__(self, level: str, limits: dict, max_frame: int) -> None:
        self.level, self.limits, self.max_frame = level, limits, max_frame
        self.proc: subprocess.Popen | None = None
        self.wfd = self.rfd = -1
        self.workdir: str | None = None
        self.lock = anyio.Lock()
        self.buf = bytearray()
        # one reusable read buffer: os.read(fd, 1 MiB) allocates (and shrinks) a 1 MiB bytes
        # object per call, which moves glibc's mmap threshold and grows the parent's heap
        self._chunk = bytearray(_READ_CHUNK)
        self.dead: str | None = None  # why, once dead
        self.env_id: str | None = None
        # the id the worker is told (protocol.Open): random, the same shape for every caller
        self.wire_id = secrets.token_hex(8)
        self.instances: set[int] = set()
        self.opening = 0  # Open requests in flight (placement counts them as instances)
        self.busy_s = 0.0  # duration of the last successful round trip
        self.last_used = time.monotonic()
        self.seccomp = False
        self.cgroup = None  # its pids cgroup (tasks.py), while it lives
        # on the worker's command line: find its processes in /proc (tests, leak checks)
        self.tag = f"spade-worker-{os.getpid()}-{next(_serial)}"
        self._seq = itertools.count(1)  # request numbers; Ready is 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, timeout: float) -> None:
        made = tasks.cgroups()
        mode = tasks.mode()
        # the task limit that binds (tasks.py): without a cgroup, root gets no threads at all
        limits = {**self.limits, "tag": self.tag, "threads": mode != "no-threads"}
        if made is not None:
            try:
                self.cgroup = made.create(self.tag, self.limits["nproc"])
            except OSError as exc:  # never a worker without the limit the pool reports
                raise EnvError("boot", f"cannot make the worker's pids cgroup: {exc}") from None
        # Spawned on the event-loop thread on purpose (a few ms): bwrap's --die-with-parent
        # is PR_SET_PDEATHSIG, which fires when the *thread* that forked exits, so a
        # short-lived to_thread worker would take the sandbox down with it.
        try:
            self.proc, self.wfd, self.rfd, self.workdir, err_fd = sandbox.spawn(
                self.level, limits, self.cgroup
            )
        except BaseException:
            self._drop_cgroup()
            raise
        try:
            await self._boot(timeout, err_fd)
        finally:
            os.close(err_fd)

    async def _boot(self, timeout: float, err_fd: int) -> None:
        """Wait for Ready; a worker that dies first is described by its boot-time stderr."""
        try:
            with anyio.fail_after(timeout):
                ready = await self._read_reply(0)
        except (TimeoutError, EOFError, OSError, EnvError, msgspec.DecodeError,
                RecursionError, replies.ReplyError) as exc:  # fmt: skip
            rc = await self.kill(f"boot failed: {exc!r}", grace=0.2)
            said = failure.error_line(_read_available(err_fd), any_last=True)
            raise EnvError(
                "boot",
                f"worker did not start at isolation {self.level} ({exc!r}, exit status {rc})"
                + (f": {said}" if said else ""),
            ) from None
        except BaseException:
            await self.kill("cancelled during boot")
            raise
        if not isinstance(ready, P.Ready):
            await self.kill("bad hello")
            raise EnvError("boot", f"worker sent {type(ready).__name__} instead of Ready")
        self.seccomp = ready.seccomp

    # --- framing ---------------------------------------------------------------------
    async def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.wfd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self.wfd)
            except BrokenPipeError:
                raise EOFError("worker closed its request pipe") from None

    def _refuse_unsolicited(self) -> None:
        """Bytes waiting before we asked anything are a frame the worker was not asked for."""
        try:
            waiting = os.readv(self.rfd, [self._chunk])
        except BlockingIOError:
            waiting = 0
        if self.buf or waiting:
            raise EnvError("protocol", "the worker sent a reply frame nobody asked for")

    async def _read_reply(self, seq: int) -> object:
        buf, h = self.buf, P.HEADER.size
        while True:
            if len(buf) >= h:
                n, got = P.HEADER.unpack_from(buf)
                if n > self.max_frame:
                    raise EnvError(
                        "output_too_large", f"reply frame of {n:,} bytes (cap {self.max_frame:,})"
                    )
                if got != seq:
                    raise EnvError("protocol", f"reply frame numbered {got}, expected {seq}")
                if len(buf) >= h + n:
                    msg = _DECODER.decode(memoryview(buf)[h : h + n])
                    del buf[: h + n]
                    if buf:
                        raise EnvError("protocol", "the worker sent more than one reply frame")
                    return msg
            try:
                got_n = os.readv(self.rfd, [self._chunk])
            except BlockingIOError:
                await anyio.wait_readable(self.rfd)
                continue
            if not got_n:
                raise EOFError("worker closed its reply pipe")
            buf += memoryview(self._chunk)[:got_n]

    async def request(self, msg: object, timeout: float) -> object:
        """One round trip. Worker-side failures -> EnvError; the worker survives those."""
        seq = next(self._seq)
        try:
            data = P.frame(_ENCODER.encode(msg), seq)
        except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in an action
            raise ValueError(f"cannot send {type(msg).__name__} to a worker: {exc}") from None
        async with self.lock:
            if self.dead:
                raise EnvError("lost", f"worker is dead ({self.dead})")
            self.last_used = t0 = time.monotonic()
            failure: EnvError | None = None
            try:
                with anyio.fail_after(timeout):
                    self._refuse_unsolicited()
                    await self._write(data)
                    reply = replies.check(msg, await self._read_reply(seq), self.limits)
                self.busy_s = time.monotonic() - t0  # the round trip, not the wait for the lock
            except TimeoutError:
                failure = EnvError(
                    "timeout", f"{type(msg).__name__.lower()} took longer than {timeout:g} s"
                )
            except EnvError as exc:
                failure = exc
            except replies.ReplyError as exc:
                failure = EnvError(exc.kind, f"{exc.message} (refused by the parent)")
            except (EOFError, OSError) as exc:
                failure = EnvError("crash", str(exc))
            except (msgspec.DecodeError, RecursionError) as exc:  # also nesting too deep
                failure = EnvError("protocol", f"corrupt reply frame: {exc}")
            except anyio.ClosedResourceError:
                failure = EnvError("lost", f"worker was killed ({self.dead})")
            except BaseException:
                await self.kill("caller cancelled mid-request")
                raise
            if failure is not None:
                rc = await self.kill(failure.message, grace=0.5 if failure.kind == "crash" else 0)
                if failure.kind == "crash" and rc is not None:  # it died by itself: say how
                    kind, text = _exit_reason(rc)
                    failure = EnvError(kind, text)
                self.dead = failure.message
                raise failure
        if isinstance(reply, P.Err):
            raise EnvError(reply.kind, reply.message)
        return reply

    async def kill(self, why: str, grace: float = 0.0) -> int | None:
        """SIGKILL the worker's process group, reap it, close fds.

        Returns the exit status when the worker had exited on its own (within ``grace``
        seconds, for one that is already dying), None when our SIGKILL ended it.
        """
        with anyio.CancelScope(shield=True):  # cleanup must finish even when cancelled
            return await self._kill(why, grace)

    async def _kill(self, why: str, grace: float) -> int | None:
        if self.dead is None:
            self.dead = why
        rc = None
        if self.proc is not None:
            proc, self.proc = self.proc, None
            with anyio.move_on_after(grace):
                while proc.poll() is None:
                    await anyio.sleep(0.002)
            rc = proc.returncode  # None: still running, so the status will be our SIGKILL
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            await anyio.to_thread.run_sync(proc.wait)
        for fd in (self.wfd, self.rfd):
            if fd >= 0:
                anyio.notify_closing(fd)  # a task waiting on it gets ClosedResourceError
                os.close(fd)
        self.wfd = self.rfd = -1
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self._drop_cgroup()
        return rc

    def _drop_cgroup(self) -> None:
        made = tasks.cgroups()
        if self.cgroup is not None and made is not None:
            made.remove(self.cgroup)
        self.cgroup = None
