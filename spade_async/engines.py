"""Generation engines for a run: CPU engines (the project's server) or SGLang servers.

Placement is config: ``kind = "cpu"`` starts ``count`` CPU engines
(``python -m spade_async.generation.server``), each with ``threads`` torch threads;
``kind = "sglang"`` starts one SGLang server per entry of ``gpus`` (a list of GPU-id lists;
tensor parallelism = the list's length) through the SGLang adapter. Every engine runs in
its own process group and is stopped (SIGTERM, then SIGKILL) when the run ends.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from spade_async import watchdog
from spade_async.config import Doc
from spade_async.errors import ConfigError
from spade_async.generation.sglang import SGLangConfig, SGLangServer, check_flags


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: Doc(
        Literal["cpu", "sglang"], "cpu: the project's transformers engine; sglang: SGLang servers"
    ) = "cpu"
    count: Doc(int, "CPU engines to start (kind = cpu)") = 1
    threads: Doc(int, "torch threads per CPU engine; 0 = torch's default") = 0
    cpus: Doc(list[int], "CPU cores the CPU engines are pinned to; [] = no pinning") = []
    dtype: Doc(str, "CPU engine weights dtype") = "float32"
    gpus: Doc(
        list[list[int]],
        "kind = sglang: GPU ids, one list per server (its TP group); see placement.py",
    ) = msgspec.field(default_factory=list)
    mem_fraction_static: Doc(float, "SGLang memory fraction for weights + KV cache") = 0.8
    extra_args: Doc(list[str], "extra SGLang server arguments, verbatim") = []
    deterministic: Doc(
        bool,
        "reproducible generation: SGLang runs --enable-deterministic-inference (it honours "
        "sampling_seed only with it, at some speed cost); the CPU engine runs --deterministic "
        "(one sequence at a time, no prefix cache, threads fixed: 1 unless `threads`). Set by "
        "the run's `deterministic`",
    ) = False
    base_port: Doc(int, "first engine port (0 = pick free ports)") = 0
    host: Doc(str, "bind address of the engines") = "127.0.0.1"
    start_timeout_s: Doc(float, "limit for an engine to become healthy") = 600.0
    max_restarts: Doc(int, "restarts of a crashed engine before the run stops") = 3
    max_running_requests: Doc(
        int, "sequences an engine decodes at once (--max-running-requests); 0 = its default"
    ) = 0
    priority_scheduling: Doc(
        bool,
        "older groups first: engines run SGLang's priority scheduling (lower values first) and "
        "each agent request carries the trainer step its group is for (the async schedule), "
        "so a group's later turns go before a newer group's first; matters once requests "
        "queue (max_running_requests, KV memory)",
    ) = False
    # ---- beyond one node (spade_async/launch/) ----
    router: Doc(
        bool,
        "put SGLang's router (sglang-router) in front of the engines; generation goes through it",
    ) = False
    router_policy: Doc(
        Literal["cache_aware", "round_robin", "power_of_two", "random"],
        "the router's policy; cache_aware keeps an episode on the engine holding its prefix",
    ) = "cache_aware"
    router_port: Doc(int, "the router's port (0 = a free port)") = 0
    external: Doc(
        list[str],
        "engines started elsewhere (http://host:port), attached and pushed to, left running at exit",
    ) = []


def check_engine(cfg: EngineConfig) -> None:
    """At start and in ``--dry-run``: SGLang flags the pinned release lacks fail, one line."""
    if cfg.max_running_requests < 0:
        raise ConfigError(
            f"engine.max_running_requests={cfg.max_running_requests}: give a positive number "
            "of sequences, or 0 for the engine's default"
        )
    if cfg.kind == "cpu" and cfg.count == 0 and not cfg.external:
        raise ConfigError(
            "engine.count = 0 starts no engine and engine.external names none: set "
            "engine.count >= 1, or attach running engines with engine.external"
        )
    if cfg.kind == "sglang":
        check_flags(cfg.extra_args + scheduling_flags(cfg))


class CPUEngineServer(SGLangServer):
    """The project's CPU engine, supervised by the same start/health/stop/restart logic."""

    kind = "the project's CPU engine (spade_async.generation.server, not SGLang)"

    def __init__(
        self,
        cfg: SGLangConfig,
        *,
        threads: int,
        dtype: str,
        cpus: list[int] = (),
        flags: list[str] = (),
    ) -> None:
        super().__init__(msgspec.structs.replace(cfg, gpu_ids=[0], extra_args=[]))  # checks only
        self.cfg = cfg
        self.argv = (
            [
                sys.executable,
                "-m",
                "spade_async.generation.server",
                "--model",
                cfg.model_path,
                "--host",
                cfg.host,
                "--port",
                str(cfg.port),
                "--dtype",
                dtype,
                "--weight-version",
                cfg.weight_version,
            ]
            + (["--threads", str(threads)] if threads else [])
            + (["--deterministic"] if cfg.deterministic else [])
            + list(flags)
        )
        if cfg.deterministic and not threads:
            threads = 1  # the thread count fixes the order of every reduction
        self.env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
        self.argv = watchdog.prefix(cpus=cpus) + self.argv


# older steps first (lower values first); one step apart is enough to take a newer group's
# row: SGLang's default threshold, 10, would never preempt, as groups in flight are at most
# 1 + max_staleness apart
PRIORITY_FLAGS = ("--enable-priority-scheduling", "--schedule-low-priority-values-first")
PREEMPTION_THRESHOLD = ("--priority-scheduling-preemption-threshold", "0")


ROUTES_FLAG = "--enable-return-routed-experts"  # routing replay (generation/routed_experts.py)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lora_flags(lora, extra_args: list[str] = ()) -> list[str]:
    """SGLang's flags that serve ``trainer.lora``'s adapters (``LoraConfig``; None: none),
    unless ``extra_args`` enables LoRA itself."""
    from spade_async.generation.lora import launch_args

    if lora is None or "--enable-lora" in extra_args:
        return []
    return launch_args(lora.rank, list(lora.target_modules))


def scheduling_flags(cfg: EngineConfig) -> list[str]:
    """SGLang's scheduler flags for ``max_running_requests`` and ``priority_scheduling``
    (the CPU engine takes the same names), unless ``extra_args`` sets them itself."""
    out: list[str] = []
    if cfg.max_running_requests and "--max-running-requests" not in cfg.extra_args:
        out += ["--max-running-requests", str(cfg.max_running_requests)]
    if cfg.priority_scheduling:
        out += [f for f in PRIORITY_FLAGS if f not in cfg.extra_args]
        if PREEMPTION_THRESHOLD[0] not in cfg.extra_args:
            out += PREEMPTION_THRESHOLD
    return out


def servers(
    cfg: EngineConfig,
    model_dir: str | Path,
    log_dir: Path,
    *,
    weight_version: int = 0,
    lora=None,
    routed_experts: bool = False,
) -> list[SGLangServer]:
    """The engine servers of ``cfg``; ``lora`` (``trainer.lora``): they serve its adapters;
    ``routed_experts`` (``trainer.routing_replay``): they return MoE routes (the CPU engine
    takes SGLang's flag too)."""
    out: list[SGLangServer] = []
    routes = [ROUTES_FLAG] if routed_experts and ROUTES_FLAG not in cfg.extra_args else []
    groups = [[]] * cfg.count if cfg.kind == "cpu" else cfg.gpus
    for i, gpus in enumerate(groups):
        port = cfg.base_port + i if cfg.base_port else free_port()
        scfg = SGLangConfig(
            model_path=str(model_dir),
            gpu_ids=list(gpus),
            port=port,
            host=cfg.host,
            tp_size=max(1, len(gpus)),
            mem_fraction_static=cfg.mem_fraction_static,
            weight_version=str(weight_version),
            extra_args=list(cfg.extra_args)
            + (
                lora_flags(lora, cfg.extra_args) + scheduling_flags(cfg) + routes
                if cfg.kind == "sglang"
                else []
            ),
            deterministic=cfg.deterministic,
            start_timeout_s=cfg.start_timeout_s,
            max_restarts=cfg.max_restarts,
            log_path=str(log_dir / f"engine-{i}.log"),
        )
        if cfg.kind == "cpu":
            out.append(
                CPUEngineServer(
                    scfg,
                    threads=cfg.threads,
                    dtype=cfg.dtype,
                    cpus=cfg.cpus,
                    flags=lora_flags(lora) + scheduling_flags(cfg) + routes,
                )
            )
        else:
            server = SGLangServer(scfg)
            server.argv = watchdog.prefix() + server.argv  # dies with the controller
            out.append(server)
    return out


@contextlib.asynccontextmanager
async def running_engines(
    cfg: EngineConfig,
    model_dir: str | Path,
    log_dir: Path,
    *,
    weight_version: int = 0,
    lora=None,
    routed_experts: bool = False,
) -> AsyncIterator[list[SGLangServer]]:
    """Start every engine (supervised, restarted on crashes) at once; yield them once all
    are healthy; stop them. A failed start stops the others."""
    procs = servers(
        cfg, model_dir, log_dir, weight_version=weight_version, lora=lora,
        routed_experts=routed_experts,
    )  # fmt: skip
    async with anyio.create_task_group() as tg:

        async def launch(p: SGLangServer) -> None:
            await tg.start(p.run)

        async with anyio.create_task_group() as starting:  # cold starts overlap
            for p in procs:
                starting.start_soon(launch, p)
        try:
            yield procs
        finally:
            tg.cancel_scope.cancel()


def kill_now(procs: list[SGLangServer]) -> None:
    """SIGKILL every engine's process tree (the second Ctrl-C)."""
    for p in procs:
        if p.process is not None and p.process.returncode is None:
            watchdog.kill_tree(p.process.pid)
