"""Everything a run holds open, started together and torn down together.

``open_runtime`` resolves the model, opens memory (importing the initial pool on a new run),
the corpus, the sandbox pool, the trainer ranks and the generation engines, and the
telemetry. Engines start from the latest checkpoint's Hugging Face export on resume, so the
policy the engines serve always equals the trainer's. Every child process is gone when the
context exits, however it exits.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import numpy as np

from spade_async import watchdog
from spade_async.config import to_toml_dict
from spade_async.corpus import Corpus, open_corpus
from spade_async.engines import running_engines
from spade_async.envs.pool import EnvPool
from spade_async.episodes.journal import DIR_NAME, Journal
from spade_async.episodes.recovery import Recovery, open_journal
from spade_async.errors import ConfigError
from spade_async.generation.client import GenerationClient
from spade_async.launch.external import attach
from spade_async.launch.router import RoutedClient, running_router
from spade_async.loop.lora import AdapterBook
from spade_async.memory.store import MemoryStore, open_checked
from spade_async.memory.writer import MemoryWriter
from spade_async.models import load_tokenizer, resolve_model
from spade_async.placement import trainer_process
from spade_async.rundir import RunDir, write_atomic
from spade_async.telemetry.metrics import Meters, Telemetry
from spade_async.telemetry.progress import status
from spade_async.trainer.client import AsyncTrainerClient, TrainerDied
from spade_async.trainer.launch import TrainerProcess

if TYPE_CHECKING:
    from spade_async.recipe import Config
    from spade_async.trainer.rpc import WeightsPushed


class ControllerState(msgspec.Struct, kw_only=True):
    """What the controller saves beside the trainer's checkpoint."""

    step: int = 0
    version: int = 0
    current_envs: list[str] = []  # env ids the agent is playing in this regeneration window
    meters: dict[str, Any] = {}
    inflight_lost: int = 0
    skill_ema: dict[str, float] = {}  # slow EMA of no-hint win rate per skill (learning potential)


@dataclass
class Runtime:
    cfg: Config
    run_dir: RunDir
    tokenizer: Any
    client: GenerationClient
    pool: EnvPool
    store: MemoryStore
    writer: MemoryWriter
    corpus: Corpus | None
    trainer: AsyncTrainerClient
    trainer_proc: TrainerProcess
    tel: Telemetry
    engine_urls: list[str]
    state: ControllerState
    engines: list = field(default_factory=list)
    resume_note: str = ""
    release_memory: bool = False  # colocated: engines release GPU memory around train steps
    push_kw: dict[str, Any] = field(default_factory=dict)  # PushWeights fields (push_kwargs)
    model_dir: Path | None = None  # the base model the trainer starts from without a checkpoint
    trainer_restarts: int = 0  # restarts so far
    pushed_group_epoch: int = -1  # distributed push: the NCCL weight group last used
    adapters: AdapterBook | None = None  # trainer.lora: the adapters engines hold (loop/lora.py)
    meters: Meters = field(default_factory=Meters)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    journal: Journal | None = None  # finished episodes until checkpointed (docs/resume.md)
    recovery: Recovery | None = None  # what the journal held at start (loop/resume.py)
    requeue: list = field(default_factory=list)  # finished episodes a resume gave back

    def kill_children(self) -> None:
        """Second Ctrl-C: SIGKILL engines and trainer ranks now (environment workers die
        with this process: bubblewrap's --die-with-parent)."""
        from spade_async.engines import kill_now

        kill_now(self.engines)
        if self.trainer_proc.proc is not None:
            watchdog.kill_tree(self.trainer_proc.proc.pid)

    async def checkpoint(self) -> Path:
        """Trainer state (DCP) + HF export + controller state; ``DONE`` marks it complete."""
        path = self.run_dir.checkpoint(self.state.step)
        with self.meters.busy("trainer"):
            try:
                await self.trainer.save(str(path), hf_directory=str(self.run_dir.hf))
            except TrainerDied as exc:  # restarted from the previous checkpoint, saved as this
                await self.restart_trainer(str(exc))
                await self.trainer.save(str(path), hf_directory=str(self.run_dir.hf))
        self.state.meters = self.meters.state_dict()
        write_atomic(path / "controller.json", msgspec.json.encode(self.state))
        write_atomic(path / "DONE", b"")
        if self.journal is not None:  # episodes trained by now are settled
            await self.journal.checkpointed(self.state.step)
        return path

    async def push(self, *, pause: bool) -> WeightsPushed:
        """The trainer's weights to every engine; their version becomes the trainer's. With
        generation in flight (``pause``) the trainer pauses the engines only around the
        engine-side update."""
        kw = dict(self.push_kw)
        if kw.get("mode") == "distributed":  # a new NCCL group after any restart (group.py)
            epoch = self.trainer_restarts + sum(getattr(e, "restarts", 0) for e in self.engines)
            if epoch != self.pushed_group_epoch and self.pushed_group_epoch >= 0:
                from spade_async.engines import free_port

                self.push_kw["master_port"] = kw["master_port"] = free_port()
            kw.update(group_epoch=epoch, previous_group_epoch=self.pushed_group_epoch)
        if self.adapters is not None:  # only the adapter, under a new name (loop/lora.py)
            kw.update(lora_taken=self.adapters.taken(), lora_keep=-1)
            pause = False  # loading an adapter leaves running requests alone
        pushed = await self.trainer.push_weights(
            **kw, pause_mode=self.cfg.pipeline.pause_mode if pause else ""
        )
        self.pushed_group_epoch = kw.get("group_epoch", -1)
        self.state.version = pushed.version
        if self.adapters is not None:
            self.client.set_adapter(self.adapters.pushed(pushed.engines))
            unloaded = await self.adapters.retire(self.client)
            self.meters.count("lora/unloaded", len(unloaded))
        return pushed

    def engine_crashed(self, server) -> None:
        """A crashed engine will come back serving its start-up weights: out of the
        generation client's rotation (retries included) until ``engine_restarted`` pushed;
        under LoRA it comes back holding no adapters."""
        self.client.hold(server.url)
        if self.adapters is not None:
            self.adapters.forget(server.url)

    async def engine_restarted(self, server) -> None:
        """A crashed engine came back serving its start-up weights: the current ones go to
        every engine now (through a new NCCL group on the distributed path); only then does
        it rejoin the rotation, so it never generates with weights older than the trainer's."""
        pause = self.cfg.schedule == "async"
        try:
            await self.push(pause=pause)
        except TrainerDied as exc:  # the restarted trainer pushes its weights itself
            await self.restart_trainer(str(exc), pause=pause)
        self.client.release(server.url)

    async def restart_trainer(self, why: str, *, pause: bool = False) -> None:
        """A dead trainer comes back from the latest checkpoint (or the base model) and its
        weights go to the engines, so their version equals the trainer's again; the steps
        since that checkpoint are lost (counted). Past ``trainer_restarts``: ``TrainerDied``.
        """
        cfg = self.cfg
        if self.trainer_restarts >= cfg.trainer_restarts:
            raise TrainerDied(
                f"{why}; stopped after {self.trainer_restarts} trainer restart(s) "
                f"(trainer_restarts = {cfg.trainer_restarts}): `spade train {self.run_dir.root}` "
                "resumes from the last checkpoint"
            )
        self.trainer_restarts += 1
        self.meters.count("trainer/restarts")
        self.trainer_proc.stop(timeout=5.0)
        latest = self.run_dir.latest_checkpoint()
        load = str(latest[1]) if latest is not None else None
        proc = trainer_process(
            cfg, self.model_dir or resolve_model(cfg.model), self.run_dir.root, load=load
        )
        self.trainer_proc = proc
        self.trainer = AsyncTrainerClient(await anyio.to_thread.run_sync(proc.start))
        before = self.state.version
        pushed = await self.push(pause=pause)
        lost = before - pushed.version
        self.meters.count("trainer/lost_versions", lost)
        where = f"checkpoint step {latest[0]}" if latest is not None else "the base model"
        self.tel.event(
            self.state.step,
            f"trainer died ({why}); restarted from {where} "
            f"(restart {self.trainer_restarts}/{cfg.trainer_restarts}): policy version "
            f"{pushed.version}, {lost} version(s) lost",
        )


async def _import_initial(
    cfg: Config, store: MemoryStore, pool: EnvPool, writer: MemoryWriter
) -> None:
    """Seed a new run's memory through the validation gates: the bundled examples and/or a
    fixed pool, all at once in the run's own sandbox pool."""
    from spade_async.memory.importer import import_files

    jobs: list[tuple[Path | str, dict]] = []
    if cfg.initial_memory == "examples":
        from spade_async.envs.examples import EXAMPLES, HERE

        jobs += [
            (HERE / n, {"skill": sk, "setting": st, "kind": "pool"})
            for n, (sk, st) in EXAMPLES.items()
        ]
    elif cfg.initial_memory:
        jobs.append((Path(cfg.initial_memory), {"kind": "import"}))
    if cfg.fixed_pool:
        from spade_async.memory.importer import is_source_value

        pool_src = cfg.fixed_pool if is_source_value(cfg.fixed_pool) else Path(cfg.fixed_pool)
        jobs.append((pool_src, {"kind": "pool"}))
    with status(f"importing {len(jobs)} environment source(s) into memory through the gates"):
        async with anyio.create_task_group() as tg:
            for src, kw in jobs:
                tg.start_soon(partial(import_files, store, src, pool=pool, writer=writer, **kw))


def push_kwargs(
    cfg: Config, urls: list[str], *, external_tp: list[int] | None = None
) -> dict[str, Any]:
    """How ``push_weights`` reaches the engines (``placement.push_mode``): the engine URLs
    (GPU paths append each server's TP size), the mode, and for NCCL the rendezvous of
    trainer rank 0 and the engines (all on this node)."""
    from spade_async.engines import free_port
    from spade_async.placement import push_mode

    mode = push_mode(cfg)
    # the engines' weight dtype: the CPU engine's own, else SGLang's --dtype (auto: '')
    extra = cfg.engine.extra_args
    dtype = cfg.engine.dtype if cfg.engine.kind == "cpu" else ""
    for i, arg in enumerate(extra):
        if arg == "--dtype" and i + 1 < len(extra):
            dtype = extra[i + 1]
        elif arg.startswith("--dtype="):
            dtype = arg.split("=", 1)[1]
    if mode in ("disk", "lora"):  # lora: the adapter directory, /load_lora_adapter
        kw: dict[str, Any] = {"engines": list(urls), "mode": mode, "dtype": dtype}
        if cfg.placement.weight_dir:  # external engines on another node read it from here
            kw["shm_dir"] = cfg.placement.weight_dir
        return kw
    tps = [max(1, len(g)) for g in cfg.engine.gpus] + list(external_tp or [])
    engines = [f"{u}#tp={tp}" for u, tp in zip(urls, tps, strict=True)]
    if mode == "tensor":  # CUDA IPC: each TP rank gets handles from the trainer rank on its GPU
        gpus = [",".join(map(str, g)) for g in cfg.engine.gpus]
        engines = [f"{e};gpus={g}" for e, g in zip(engines, gpus, strict=True)]
    kw = {"engines": engines, "mode": mode, "dtype": dtype}
    if mode == "distributed":  # engines elsewhere reach the trainer node at master_addr
        kw.update(master_address=cfg.placement.master_addr or "127.0.0.1", master_port=free_port())
    return kw


@contextlib.asynccontextmanager
async def open_runtime(cfg: Config, run_dir: RunDir) -> AsyncIterator[Runtime]:
    resumed = run_dir.latest_checkpoint()
    state = ControllerState()
    if resumed is not None:
        state = msgspec.json.decode(
            (resumed[1] / "controller.json").read_bytes(), type=ControllerState
        )
    external = await attach(cfg.engine.external) if cfg.engine.external else {}
    model_dir = resolve_model(cfg.model)
    lora = cfg.trainer.lora is not None  # engines: the frozen base + adapters (loop/lora.py)
    engine_model = (
        run_dir.hf if resumed is not None and run_dir.hf.is_dir() and not lora else model_dir
    )
    tokenizer = load_tokenizer(str(model_dir) if Path(str(model_dir)).is_dir() else cfg.model)
    # a resumed run's memory is read whole by a child first: damage is one line, exit 2
    store = open_checked(run_dir.memory, cfg.memory, readonly=False)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(store.close)
        journal, recovery = open_journal(run_dir.root / DIR_NAME, resumed and resumed[0])
        stack.callback(journal.close)
        if cfg.placement.controller_cpus:  # before any child starts: env workers inherit it
            try:
                watchdog.pin_self(cfg.placement.controller_cpus, "placement.controller_cpus")
            except ValueError as e:
                raise ConfigError(str(e)) from None
            stack.callback(watchdog.unpin_self)
        corpus = None
        if cfg.designer_enabled and cfg.designer.use_corpus:
            corpus = stack.enter_context(open_corpus(cfg.corpus))
        proc = trainer_process(  # ranks, threads and CUDA_VISIBLE_DEVICES from cfg.placement
            cfg, model_dir, run_dir.root, load=str(resumed[1]) if resumed is not None else None
        )
        current: dict[str, TrainerProcess] = {"proc": proc}  # a restart replaces it
        stack.callback(lambda: current["proc"].stop())  # after the task group below exits
        tg = await stack.enter_async_context(anyio.create_task_group())
        writer = MemoryWriter(store)
        await tg.start(writer.run)
        stack.push_async_callback(_close_writer, writer)
        pool = await stack.enter_async_context(EnvPool(cfg.envs))
        started: dict[str, Any] = {}
        trainer_up, imported = anyio.Event(), anyio.Event()

        async def start_trainer() -> None:  # overlaps with the engines' start-up
            started["trainer"] = await anyio.to_thread.run_sync(proc.start)
            trainer_up.set()

        async def seed_memory() -> None:  # also overlaps: validation runs in the sandbox pool
            if resumed is None:
                await _import_initial(cfg, store, pool, writer)
            imported.set()

        tg.start_soon(start_trainer)
        tg.start_soon(seed_memory)
        engines = await stack.enter_async_context(
            running_engines(
                cfg.engine,
                engine_model,
                run_dir.root,
                weight_version=0 if lora else state.version,
                lora=cfg.trainer.lora,
                routed_experts=cfg.trainer.routing_replay,
            )
        )
        urls = [e.url for e in engines] + list(external)  # external: never stopped by us
        router = await stack.enter_async_context(running_router(cfg.engine, urls, run_dir.root))
        await trainer_up.wait()
        await imported.wait()
        client = await stack.enter_async_context(
            GenerationClient(urls, cfg.client)
            if router is None
            else RoutedClient(router.url, urls, cfg.client)
        )
        tel = stack.enter_context(
            Telemetry(run_dir.root, cfg.telemetry, run_config=to_toml_dict(cfg))
        )
        rt = Runtime(
            cfg=cfg,
            run_dir=run_dir,
            tokenizer=tokenizer,
            client=client,
            pool=pool,
            store=store,
            writer=writer,
            corpus=corpus,
            trainer=AsyncTrainerClient(started["trainer"]),
            trainer_proc=proc,
            tel=tel,
            engine_urls=urls,
            state=state,
            engines=engines + ([router] if router is not None else []),
            resume_note=_resume_note(run_dir, resumed, state, journaled=recovery is not None),
            release_memory=cfg.placement.colocate and cfg.placement.release_memory,
            push_kw=push_kwargs(cfg, urls, external_tp=list(external.values())),
            model_dir=Path(model_dir),
            rng=np.random.default_rng([cfg.seed, state.step]),
            journal=journal,
            recovery=recovery,
        )
        if cfg.trainer.routing_replay:  # every trained request brings its MoE routes
            from spade_async.generation.routed_experts import route_shape_of

            client.enable_routes(route_shape_of(model_dir))
        if lora:  # requests name the current adapter; none yet: the base (version 0)
            rt.adapters = AdapterBook([u.rstrip("/") for u in urls])
            client.use_adapters(None)
        if state.meters:
            rt.meters.load_state_dict(state.meters)
        for e in engines:  # a restarted engine gets the current weights before it serves
            e.on_restart = rt.engine_restarted
            e.on_crash = rt.engine_crashed
        # engines this run did not start serve whatever they had: the trainer's now; under
        # LoRA a resumed run's engines serve the base: its checkpoint's adapter goes first
        if external or (lora and resumed is not None):
            await rt.push(pause=False)
        try:
            yield rt
        finally:
            current["proc"] = rt.trainer_proc
        tg.cancel_scope.cancel()


def _resume_note(run_dir: RunDir, resumed, state: ControllerState, *, journaled: bool) -> str:
    """On resume: where we start; without an episode journal (a run from before it), the
    episodes played after the checkpoint that are lost (the journal's own line follows)."""
    if resumed is None:
        return ""
    if journaled:
        return (
            f"resumed {run_dir.root} from checkpoint step {resumed[0]} "
            f"(policy version {state.version})"
        )
    from spade_async.telemetry.metrics import read_metrics

    try:
        last = [r for r in read_metrics(run_dir.metrics) if r.get("kind") == "step"][-1:]
    except Exception:  # a damaged metrics file only costs the report
        last = []
    started = last[0].get("agent/started", 0) if last else 0
    consumed = state.meters.get("counters", {}).get("agent/consumed", 0) if state.meters else 0
    lost = max(0, started - consumed)
    state.inflight_lost += lost
    return (
        f"resumed {run_dir.root} from checkpoint step {resumed[0]} (policy version {state.version}); "
        f"at least {lost} episodes generated after it were lost"
    )


async def _close_writer(writer: MemoryWriter) -> None:
    writer.close()
