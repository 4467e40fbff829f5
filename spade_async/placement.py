"""GPU placement on one node: which GPUs run SGLang engines (and with what tensor parallelism),
which run FSDP trainer ranks, and whether the two share GPUs.

One source of truth per side: engine GPUs are ``engine.gpus`` (one list per SGLang server =
its TP group, see ``engines.py``); trainer GPUs are ``placement.trainer_gpus`` (one FSDP rank
each). GPU ids are the node's indices as ``nvidia-smi -L`` numbers them; every child gets its
own ``CUDA_VISIBLE_DEVICES``. Disaggregated by default (disjoint GPU sets, so generation and
training overlap); ``colocate = true`` lets them share GPUs and take turns, the engines
releasing their memory around each train step.

``check`` (called by ``recipe.check``) rejects contradictions; ``check_devices`` rejects GPUs
this machine does not have, without touching CUDA (``CUDA_VISIBLE_DEVICES`` or
``nvidia-smi -L``; no CUDA context is created in the controller). ``launch_plan`` builds
every process from the same builders the runtime uses (``engines.servers`` ->
``sglang.build_command`` / the CPU engine argv, ``trainer_process`` -> ``TrainerProcess.cmd``),
so ``spade train CONFIG --dry-run`` shows exactly what would run.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from spade_async.errors import ConfigError
from spade_async.launch.config import PlacementConfig

if TYPE_CHECKING:
    from spade_async.recipe import Config
    from spade_async.trainer.launch import TrainerProcess

__all__ = [
    "PlacementConfig",
    "PlannedProcess",
    "check",
    "check_devices",
    "visible_gpus",
    "trainer_process",
    "launch_plan",
    "format_plan",
    "describe",
    "push_mode",
]


def push_mode(cfg: Config) -> str:
    """The weight-push path ``placement.weight_push`` resolves to (``lora``: adapters only,
    whenever ``trainer.lora`` is set; loop/lora.py)."""
    mode = cfg.placement.weight_push
    if cfg.trainer.lora is not None:
        return "lora"
    if mode != "auto":
        return mode
    if cfg.engine.kind == "cpu" or not cfg.placement.trainer_gpus:
        return "disk"
    return "tensor" if cfg.placement.colocate else "distributed"


class PlannedProcess(msgspec.Struct, frozen=True, kw_only=True):
    """One process ``spade train`` would start."""

    name: str
    role: Literal["engine", "router", "trainer"]
    gpus: list[int]
    ranks: int  # tensor-parallel ranks of an engine, torchrun ranks of the trainer
    argv: list[str]
    env: dict[str, str]


def _ids(xs: Iterable[int]) -> str:
    return ", ".join(str(x) for x in xs)


def check(cfg: Config) -> None:
    """Placement contradictions, one line each (no device access)."""
    eng, pl = cfg.engine, cfg.placement
    if eng.kind == "cpu" and eng.gpus:
        raise ConfigError(
            f"engine.gpus = {eng.gpus} but engine.kind = 'cpu' (CPU engines use no GPU): "
            "remove engine.gpus or set engine.kind = 'sglang'"
        )
    if eng.kind == "sglang" and not eng.gpus and not eng.external and not pl.engine_nodes:
        raise ConfigError(
            "engine.kind = 'sglang' needs engine.gpus, one list per server (its TP group), "
            "e.g. gpus = [[0], [1]] or [[0, 1, 2, 3]]"
        )
    owner: dict[int, int] = {}
    for i, group in enumerate(eng.gpus):
        if not group:
            raise ConfigError(f"engine.gpus[{i}] is empty: give each server at least one GPU id")
        for g in group:
            if g < 0:
                raise ConfigError(f"engine.gpus[{i}] has GPU id {g}: ids are >= 0 (nvidia-smi -L)")
            if g in owner:
                where = "twice" if owner[g] == i else f"by engines {owner[g]} and {i}"
                raise ConfigError(
                    f"GPU {g} is used {where} in engine.gpus = {eng.gpus}: "
                    "each GPU belongs to one engine server"
                )
            owner[g] = i
    if len(set(pl.trainer_gpus)) != len(pl.trainer_gpus) or any(g < 0 for g in pl.trainer_gpus):
        raise ConfigError(
            f"placement.trainer_gpus = {pl.trainer_gpus}: list distinct GPU ids >= 0, one per rank"
        )
    for name, cpus in (
        ("engine.cpus", eng.cpus),
        ("placement.trainer_cpus", pl.trainer_cpus),
        ("placement.controller_cpus", pl.controller_cpus),
    ):
        if len(set(cpus)) != len(cpus) or any(c < 0 for c in cpus):
            raise ConfigError(f"{name} = {list(cpus)}: list distinct CPU core ids >= 0 (nproc)")
    if pl.cpu_ranks < 1 or pl.trainer_threads < 0:
        raise ConfigError(
            f"placement.cpu_ranks = {pl.cpu_ranks}, trainer_threads = {pl.trainer_threads}: "
            "need cpu_ranks >= 1 and trainer_threads >= 0"
        )
    shared = sorted(set(owner) & set(pl.trainer_gpus))
    if shared and not pl.colocate:
        raise ConfigError(
            f"GPU(s) {_ids(shared)} are in both engine.gpus and placement.trainer_gpus: "
            "give them disjoint GPUs, or set placement.colocate = true to share them"
        )
    if pl.colocate and eng.kind != "sglang":
        raise ConfigError(
            "placement.colocate = true needs engine.kind = 'sglang' (CPU engines use no GPU)"
        )
    if pl.colocate and pl.release_memory and "--enable-memory-saver" not in eng.extra_args:
        raise ConfigError(
            "placement.colocate with release_memory needs SGLang's memory saver: add "
            "'--enable-memory-saver' to engine.extra_args (or set placement.release_memory = false)"
        )
    if pl.colocate and cfg.schedule != "sync":
        raise ConfigError(
            "placement.colocate = true needs schedule = 'sync': engines and trainer share the "
            "GPUs and take turns, so generation cannot overlap training"
        )
    if cfg.trainer.lora is not None and pl.weight_push != "auto":
        raise ConfigError(
            f"placement.weight_push = '{pl.weight_push}' with trainer.lora: LoRA pushes only "
            "the adapter (/load_lora_adapter from a directory); leave weight_push = 'auto'"
        )
    if cfg.trainer.lora is not None and pl.colocate and pl.release_memory:
        raise ConfigError(
            "trainer.lora with placement.colocate and release_memory: SGLang resumes released "
            "weights undefined and the adapter push never resends the base; set "
            "placement.release_memory = false"
        )
    mode = push_mode(cfg)
    if mode in ("distributed", "tensor") and eng.kind != "sglang":
        raise ConfigError(
            f"placement.weight_push = '{mode}' needs engine.kind = 'sglang'; CPU engines load "
            "weights from disk (weight_push = 'disk' or 'auto')"
        )
    if mode in ("distributed", "tensor") and not pl.trainer_gpus:
        raise ConfigError(
            f"placement.weight_push = '{mode}' sends GPU tensors: give the trainer GPUs "
            "(placement.trainer_gpus) or use weight_push = 'disk'"
        )
    if mode == "tensor" and not pl.colocate:
        raise ConfigError(
            "placement.weight_push = 'tensor' (CUDA IPC) needs placement.colocate = true: "
            "disaggregated engines get weights by 'distributed' (NCCL) or 'disk'"
        )
    _check_tp(cfg)
    from spade_async.launch.layout import check_layout

    check_layout(cfg.placement, cfg.engine, push_mode(cfg), hsdp=cfg.trainer.hsdp)


def _check_tp(cfg: Config) -> None:
    """Each server's TP size must divide the model's attention heads (when config.json is here)."""
    path = Path(cfg.model).expanduser() / "config.json"
    if cfg.engine.kind != "sglang" or not path.is_file():
        return
    try:
        hf = json.loads(path.read_text())
        hf = hf.get("text_config", hf)
    except (OSError, ValueError, AttributeError):
        return  # not a readable HF config: resolve_model reports the directory at start
    heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads")
    for i, group in enumerate(cfg.engine.gpus):
        tp = len(group)
        kv_ok = kv is None or kv % tp == 0 or tp % kv == 0
        if heads is not None and (heads % tp or not kv_ok):
            fits = [
                n
                for n in (1, 2, 4, 8)
                if heads % n == 0 and (kv is None or kv % n == 0 or n % kv == 0)
            ]
            raise ConfigError(
                f"engine.gpus[{i}] = {group}: tensor-parallel size {tp} does not divide the model's "
                f"{heads} attention heads ({kv} KV heads); give each server {' or '.join(map(str, fits))} GPUs"
            )


def visible_gpus() -> tuple[list[int], str]:
    """GPU ids this process may hand out, and where that came from. Never initialises CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        items = [x.strip() for x in env.split(",") if x.strip()]
        ids: list[int] = []
        for x in items:
            if not x.lstrip("-").isdigit():
                raise ConfigError(
                    f"CUDA_VISIBLE_DEVICES={env!r} holds {x!r}; placement GPU ids are nvidia-smi "
                    "indices: unset it or list indices such as 0,1,2,3"
                )
            if int(x) < 0:
                break  # CUDA ignores this entry and every one after it
            ids.append(int(x))
        return ids, f"CUDA_VISIBLE_DEVICES={env!r}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi: a CPU-only machine"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return [], "nvidia-smi -L failed"
    ids = [int(line.split()[1].rstrip(":")) for line in out.splitlines() if line.startswith("GPU ")]
    return ids, "nvidia-smi -L"


def requested_gpus(cfg: Config) -> list[int]:
    return sorted({g for group in cfg.engine.gpus for g in group} | set(cfg.placement.trainer_gpus))


def missing_gpus(cfg: Config, visible: Iterable[int]) -> list[int]:
    return sorted(set(requested_gpus(cfg)) - set(visible))


def check_devices(cfg: Config, visible: Iterable[int] | None = None, source: str = "") -> None:
    """A placement that asks for GPUs this machine does not have fails at start, one line."""
    if visible is None:
        visible, source = visible_gpus()
    visible = list(visible)
    missing = missing_gpus(cfg, visible)
    if missing:
        have = f"GPUs {_ids(visible)}" if visible else "no GPU"
        raise ConfigError(
            f"placement asks for GPU(s) {_ids(missing)} but this machine has {have} "
            f"({source or 'given'}): edit engine.gpus / placement.trainer_gpus, "
            "or inspect the plan with --dry-run"
        )
    check_attention(cfg)
    from spade_async.plan.checks import check_start

    check_start(cfg)


def check_attention(cfg: Config) -> None:
    """A GPU attention kernel or Liger demanded where it cannot run: one line, exit 2."""
    demanded = ("flash_attention_2", "flash_attention_3", "spade_varlen")
    if cfg.trainer.liger is True:
        from spade_async.trainer.liger import check_liger

        check_liger(cfg.trainer, on_gpu=bool(cfg.placement.trainer_gpus))
    if cfg.trainer.attn_implementation not in demanded:
        return  # no torch import for the usual case
    from spade_async.trainer.model import check_attention as check

    check(cfg.trainer.attn_implementation, on_gpu=bool(cfg.placement.trainer_gpus))


def trainer_process(
    cfg: Config, model_dir: str | Path, run_dir: str | Path, *, load: str | None = None
) -> TrainerProcess:
    """The trainer's torchrun process as the placement says: ranks, threads, visible GPUs."""
    from spade_async import watchdog
    from spade_async.launch.layout import torchrun_rdzv
    from spade_async.trainer.launch import TrainerProcess

    pl = cfg.placement
    proc = TrainerProcess(
        cfg.trainer,
        model_dir,
        run_dir,
        load=load,
        nproc=len(pl.trainer_gpus) or pl.cpu_ranks,
        threads=pl.trainer_threads,
        env={"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in pl.trainer_gpus)},
        rdzv=torchrun_rdzv(cfg.placement, cfg.name),
    )
    # the ranks die with the controller, even on kill -9, and stay on their cores
    proc.cmd = watchdog.prefix(cpus=pl.trainer_cpus) + proc.cmd
    return proc


def launch_plan(
    cfg: Config,
    *,
    model_dir: str | Path,
    run_dir: str | Path = "runs/plan",
    engine_model_dir: str | Path | None = None,
    load: str | None = None,
) -> list[PlannedProcess]:
    """Every process a run starts, built by the runtime's own builders; nothing is started."""
    from spade_async.engines import servers

    out = []
    lora = cfg.trainer.lora
    engine_model = model_dir if lora is not None else (engine_model_dir or model_dir)
    procs = servers(
        cfg.engine, engine_model, Path(run_dir), lora=lora,
        routed_experts=cfg.trainer.routing_replay,
    )  # fmt: skip
    for i, srv in enumerate(procs):
        gpus = list(srv.cfg.gpu_ids) if cfg.engine.kind == "sglang" else []
        out.append(
            PlannedProcess(
                name=f"engine-{i}",
                role="engine",
                gpus=gpus,
                ranks=max(1, len(gpus)),
                argv=list(srv.argv),
                env=dict(srv.env),
            )
        )
    if cfg.engine.router:  # sglang-router in front of the engines (launch/router.py)
        from spade_async.launch.router import RouterServer

        urls = [p.argv[p.argv.index("--port") + 1] for p in out]
        router = RouterServer(
            [f"http://{cfg.engine.host}:{u}" for u in urls] + list(cfg.engine.external),
            port=cfg.engine.router_port or 30000,
            host=cfg.engine.host,
            policy=cfg.engine.router_policy,
            prometheus_port=29000,
        )
        out.append(
            PlannedProcess(name="router", role="router", gpus=[], ranks=1, argv=router.argv, env={})
        )
    proc = trainer_process(cfg, model_dir, run_dir, load=load)
    pl = cfg.placement
    out.append(
        PlannedProcess(
            name="trainer",
            role="trainer",
            gpus=list(pl.trainer_gpus),
            ranks=len(pl.trainer_gpus) or pl.cpu_ranks,
            argv=list(proc.cmd),
            env=dict(proc.env),
        )
    )
    return out


_PUSH_WORDS = {
    "disk": "safetensors on disk (/update_weights_from_disk)",
    "distributed": "NCCL broadcast from trainer rank 0 (/update_weights_from_distributed)",
    "tensor": "CUDA IPC handles (/update_weights_from_tensor)",
    "lora": "LoRA adapters only, a new name per version (/load_lora_adapter)",
}


def format_plan(
    cfg: Config,
    plan: list[PlannedProcess],
    warnings: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> str:
    """A readable table of the plan, ``notes`` (e.g. the trainer's memory), then each full
    command line."""
    from rich.console import Console
    from rich.table import Table

    pl, buf = cfg.placement, io.StringIO()
    console = Console(file=buf, width=120, color_system=None, force_terminal=False)
    how = "colocated (engines and trainer take turns)" if pl.colocate else "disaggregated"
    if pl.colocate and pl.release_memory:
        how += "; engines release/resume memory around each train step"
    how += f"; weights pushed by {_PUSH_WORDS[push_mode(cfg)]}"
    console.print(
        f"launch plan for '{cfg.name}': mode {cfg.mode}, schedule {cfg.schedule}, "
        f"model {cfg.model}, placement {how}",
        soft_wrap=True,
    )
    console.print(
        f"controller: this process (event loop, memory, dashboard) + up to "
        f"{cfg.envs.max_workers} sandboxed environment workers (no GPU)",
        soft_wrap=True,
    )
    table = Table("process", "role", "GPUs", "ranks", "environment", box=None, pad_edge=False)
    for p in plan:
        env = " ".join(f"{k}={v}" for k, v in p.env.items())
        table.add_row(p.name, p.role, _ids(p.gpus) or "cpu", str(p.ranks), env)
    console.print(table)
    text = buf.getvalue().rstrip("\n").splitlines()
    text += list(notes)
    text += ["", "commands:"] + [f"  {p.name}: {shlex.join(p.argv)}" for p in plan]
    text += [f"warning: {w}" for w in warnings]
    return "\n".join(text)


def describe(cfg: Config, run_dir: str | Path, *, gpu: str = "", sample_tokens: int = 0) -> str:
    """``spade train --dry-run``: the plan and its warnings; starts and creates nothing.
    ``gpu`` names the GPU model to plan memory for (``--gpu``; default: the one found here,
    else an H100-80GB); ``sample_tokens`` overrides the recipe's longest sample."""
    from spade_async.models import EMBEDDED, cache_root

    warnings = []
    if cfg.model in EMBEDDED:
        model_dir = cache_root() / "models" / cfg.model
    else:
        model_dir = Path(cfg.model).expanduser()
        if not (model_dir / "config.json").is_file():
            warnings.append(
                f"model directory '{model_dir}' is not on this machine "
                "(set model = '/path/to/hf-model' where the run happens)"
            )
    engine_model, load = model_dir, None
    from spade_async.rundir import RunDir

    rd = RunDir(Path(run_dir))
    resumed = rd.latest_checkpoint() if rd.exists() else None
    if resumed is not None:
        load, engine_model = str(resumed[1]), rd.hf if rd.hf.is_dir() else model_dir
    check_attention(cfg)
    from spade_async.plan.checks import check_start

    try:  # what a real start would refuse, said in the plan
        check_start(cfg)
    except ConfigError as exc:
        warnings.append(f"a real start would stop: {exc}")
    visible, source = visible_gpus()
    missing = missing_gpus(cfg, visible)
    if missing:
        warnings.append(
            f"GPU(s) {_ids(missing)} are not present here ({source}); "
            "a real start on this machine would stop with an error"
        )
    plan = launch_plan(
        cfg, model_dir=model_dir, run_dir=run_dir, engine_model_dir=engine_model, load=load
    )
    from spade_async.trainer.sizing import memory_line

    pl = cfg.placement
    memory = memory_line(
        model_dir,
        len(pl.trainer_gpus) or pl.cpu_ranks,
        mixed_precision=cfg.trainer.mixed_precision,
        on_gpu=bool(pl.trainer_gpus),
    )
    from spade_async.plan import GPUS, detect_gpu, gpu_by_name
    from spade_async.plan.memory import plan_lines
    from spade_async.trainer.model import kernels_line

    found = gpu_by_name(gpu) if gpu else detect_gpu()
    if found is None:
        found = msgspec.structs.replace(GPUS["h100-80gb"], source="default")
    kernels = kernels_line(cfg.trainer, on_gpu=bool(pl.trainer_gpus))
    notes = [memory, kernels, *plan_lines(cfg, model_dir, found, sample_tokens=sample_tokens)]
    return format_plan(cfg, plan, warnings, notes=notes)
