"""SGLang launcher: build, start, health-wait, supervise, restart and stop SGLang servers.

Thin adapter around ``python -m sglang.launch_server`` of the pinned SGLang (``PINNED``;
its flags are in ``sglang_flags.txt``, kept equal to the release's source by
``tests/contract``): ``--model-path --host --port --tp-size --mem-fraction-static
--base-gpu-id --weight-version``, ``--enable-deterministic-inference`` when the run asks
for reproducible plays (SGLang ignores ``sampling_seed`` without it), and
``extra_args``; a flag the pinned release lacks is a ``ConfigError`` before anything
starts. SGLang is never imported here: it runs in its own
process, where its side effects stay (it installs uvloop as the event-loop policy, forces
the ``spawn`` start method, installs SIGCHLD/SIGQUIT handlers and kills its process tree
on a child failure). The server gets its GPUs through ``CUDA_VISIBLE_DEVICES`` (so
``--base-gpu-id 0``), runs in its own session so ``stop`` can end the whole process group,
and gets ``SGLANG_RETURN_ORIGINAL_LOGPROB=0`` so its log-probs follow
``logprob_convention.py`` (temperature-scaled), and
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`` so ``/health`` stays 200 while a weight push
has it paused.

The NCCL weight-update group: the trainer is rank 0, engine ``i``'s TP ranks follow;
``weight_group_requests`` builds the ``/init_weights_update_group`` bodies and
``GenerationClient.init_weights_update_group`` sends them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import httpx
import msgspec

from spade_async import failure
from spade_async.config import Doc
from spade_async.errors import ConfigError
from spade_async.generation.client import EngineError
from spade_async.generation.protocol import weight_group_requests  # re-exported
from spade_async.generation.sglang_source import PINNED, pinned_flags
from spade_async.generation.sglang_state import HEALTH_GENERATION_ENV

__all__ = [
    "SGLangConfig",
    "SGLangServer",
    "build_command",
    "check_flags",
    "weight_group_requests",
    "DETERMINISTIC_FLAG",
]

DETERMINISTIC_FLAG = "--enable-deterministic-inference"


PINNED_MODULE = "sglang.launch_server"  # the real server; tests substitute a fake module


class SGLangConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_path: Doc(str, "HF model directory (or hub id) the server loads")
    gpu_ids: Doc(list[int], "GPUs this server uses (CUDA_VISIBLE_DEVICES); one per TP rank")
    port: Doc(int, "HTTP port") = 30000
    host: Doc(str, "bind address") = "127.0.0.1"
    tp_size: Doc(int, "tensor-parallel size; must equal len(gpu_ids)") = 1
    mem_fraction_static: Doc(float, "GPU memory fraction for weights + KV cache") = 0.8
    weight_version: Doc(str, "initial weight version the server reports") = "0"
    extra_args: Doc(list[str], "passed through to sglang.launch_server verbatim") = []
    deterministic: Doc(
        bool, "pass --enable-deterministic-inference (seeded sampling is honoured only with it)"
    ) = False
    python: Doc(str, "interpreter to run SGLang with; empty = this one") = ""
    module: Doc(str, "launch module (tests substitute a fake)") = "sglang.launch_server"
    start_timeout_s: Doc(float, "limit for the server to answer /health after launch") = 900.0
    stop_timeout_s: Doc(float, "grace period after SIGTERM before SIGKILL") = 30.0
    max_restarts: Doc(int, "restarts of a crashed server before giving up") = 3
    log_path: Doc(str, "file for the server's stdout/stderr; empty = inherit") = ""


def build_command(cfg: SGLangConfig) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for one server."""
    if cfg.tp_size < 1 or len(cfg.gpu_ids) != cfg.tp_size:
        raise ConfigError(
            f"SGLang server on port {cfg.port}: tp_size={cfg.tp_size} but gpu_ids={cfg.gpu_ids}; "
            "give one GPU id per tensor-parallel rank"
        )
    if not 0 < cfg.mem_fraction_static <= 1:
        raise ConfigError(f"mem_fraction_static={cfg.mem_fraction_static} must be in (0, 1]")
    if cfg.module == PINNED_MODULE:
        check_flags(cfg.extra_args)
    wanted = [DETERMINISTIC_FLAG] if cfg.deterministic else []
    argv = [
        cfg.python or sys.executable,
        "-m",
        cfg.module,
        "--model-path",
        cfg.model_path,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--tp-size",
        str(cfg.tp_size),
        "--mem-fraction-static",
        str(cfg.mem_fraction_static),
        "--base-gpu-id",
        "0",
        "--weight-version",
        cfg.weight_version,
        *[f for f in wanted if f not in cfg.extra_args],
        *cfg.extra_args,
    ]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cfg.gpu_ids),
        "SGLANG_RETURN_ORIGINAL_LOGPROB": "0",
        # /health as liveness: with generation on (SGLang's default) it waits behind a
        # pause and answers 503 after 20 s, so a weight push looked like a dead engine to
        # the client's and the router's probes (a crash is seen as the process's exit)
        HEALTH_GENERATION_ENV: "0",
    }
    return argv, env


def check_flags(args: Sequence[str], where: str = "engine.extra_args") -> None:
    """Every ``--flag`` in ``args`` must be a launch flag of the pinned SGLang: else one
    ``ConfigError`` line naming it (and the closest real flag)."""
    import difflib

    known = pinned_flags()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            near = difflib.get_close_matches(flag, known, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ConfigError(
                f"{where}: {flag} is not a flag of SGLang {PINNED} (the pinned release); "
                f"{hint}remove it or fix the spelling"
            )


class SGLangServer:
    """One SGLang server process. ``async with`` or ``run`` inside a task group."""

    def __init__(self, cfg: SGLangConfig) -> None:
        self.cfg = cfg
        self.argv, self.env = build_command(cfg)
        self.process: anyio.abc.Process | None = None
        self.restarts = 0
        self.on_restart = None  # async callable(server), awaited after each crash restart
        self.on_crash = None  # callable(server), called when a crash is seen, before restart
        self._log: IO[bytes] | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "::") else self.cfg.host
        return f"http://{host}:{self.cfg.port}"

    async def __aenter__(self) -> SGLangServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Launch and wait for /health; on timeout or early exit, kill it and raise EngineError."""
        self._stopping = False
        out: IO[bytes] | None = None
        if self.cfg.log_path:
            Path(self.cfg.log_path).parent.mkdir(parents=True, exist_ok=True)
            out = self._log = open(self.cfg.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = await anyio.open_process(
            self.argv,
            env={**os.environ, **self.env},
            stdin=None,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise

    async def _wait_healthy(self) -> None:
        """Poll ``_ready`` until it says yes, the process dies (one line naming why) or
        ``start_timeout_s`` passes (one line with what was last seen)."""
        proc, deadline = self.process, self.cfg.start_timeout_s
        seen = ""
        async with httpx.AsyncClient(timeout=5.0) as http:
            with anyio.move_on_after(deadline):
                while True:
                    if proc.returncode is not None:
                        raise EngineError(self._died(proc.returncode, "during start-up"))
                    try:
                        ready, seen = await self._ready(http)
                        if ready:
                            return
                    except httpx.TransportError:
                        pass
                    await anyio.sleep(self.POLL_S)
        raise EngineError(
            f"{self.kind} {self.url} not {self.READY_WORD} within {deadline:.0f} s"
            f"{f' ({seen})' if seen else ''}; see {self.cfg.log_path or 'its output'} "
            "(raise start_timeout_s for large models)"
        )

    POLL_S, READY_WORD = 0.5, "healthy"

    async def _ready(self, http: httpx.AsyncClient) -> tuple[bool, str]:
        """Up when ``/health`` answers 200 (and what was seen, for the timeout's line)."""
        status = (await http.get(self.url + "/health")).status_code
        return status == 200, f"/health answered {status}"

    @property
    def kind(self) -> str:
        """Which engine this is, for messages (the CPU engine and the router name their own)."""
        return "SGLang server" if self.cfg.module == PINNED_MODULE else f"engine {self.cfg.module}"

    def _died(self, status: int | None, when: str) -> str:
        """One line: which engine, its exit status, its log's last error line, the log."""
        if not self.cfg.log_path:
            return (
                f"{self.kind} {self.url} exited with status {status} {when} (its output is above)"
            )
        return failure.died(f"{self.kind} {self.url}", status, self.cfg.log_path, when)

    async def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after ``stop_timeout_s``. Shielded: a stop
        inside a cancelled scope (a start cut short by a failing sibling) still reaps the
        process and closes its transport, instead of leaving both for the GC."""
        self._stopping = True
        proc, self.process = self.process, None
        with anyio.CancelScope(shield=True):
            if proc is not None and proc.returncode is None:
                _signal_group(proc.pid, signal.SIGTERM)
                with anyio.move_on_after(self.cfg.stop_timeout_s):
                    await proc.wait()
                if proc.returncode is None:
                    _signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
            if proc is not None:
                await proc.aclose()
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()
        self.restarts += 1

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start, report the URL through ``task_status``, restart on crashes; stop on cancel."""
        try:
            await self.start()
            task_status.started(self.url)
            while True:
                proc = self.process
                await proc.wait()
                if self._stopping:
                    return
                if self.restarts >= self.cfg.max_restarts:
                    raise EngineError(
                        self._died(proc.returncode, f"after {self.restarts} restarts")
                    )
                if self.on_crash is not None:
                    self.on_crash(self)
                await self.restart()
                if self.on_restart is not None:
                    await self.on_restart(self)
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
