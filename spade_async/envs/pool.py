"""An anyio pool of sandboxed environment workers.

    async with EnvPool(PoolConfig()) as pool:
        inst = await pool.open(source)                 # env_id defaults to a source hash
        obs, info = await pool.reset(inst, seed=0)
        obs, reward, terminated, truncated, info = await pool.step(inst, r"\\boxed{go}")
        await pool.close(inst)

Rules: two environments never share a worker. Instances of one environment (``env_id``)
share a worker, unless its steps are slow (measured mean above ``spread_step_ms``): then a
new instance goes to another worker of the same environment, up to ``workers_per_env``
(default auto: one worker per open instance within a fair share of ``max_workers``), so
the plays of a GRPO group step in parallel instead of one at a time behind one worker's
lock (the validator's cross-process determinism gate is what makes that safe).
At most ``max_workers`` processes live at once; ``prewarm`` clean workers wait booted, so an
``open`` of a new environment does not pay the interpreter start. A worker whose environment
has no open instance stays loaded (a later open is instant) until its slot is needed. Every
call has a wall-clock timeout; a timeout, crash or corrupt reply kills the worker's process
group and raises ``EnvError``; instances that lived on it then raise ``EnvError("lost")``.
The pool never lets one environment's failure stop another's calls.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import msgspec

from spade_async.config import Doc
from spade_async.envs import protocol as P
from spade_async.envs import sandbox, tasks
from spade_async.envs.packages import package_binds
from spade_async.envs.process import EnvError, WorkerProcess, fix_mmap_threshold
from spade_async.envs.static import StructureError, find_env_class

__all__ = ["EnvPool", "PoolConfig", "EnvError", "Instance"]

log = logging.getLogger(__name__)


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    isolation: Doc(
        Literal["auto", "bwrap", "unshare", "rlimit"], "sandbox level; auto = strongest that works"
    ) = "auto"
    max_workers: Doc(int, "most worker processes alive at once (bounded concurrency)") = 16
    prewarm: Doc(int, "clean booted workers kept waiting for new environments") = 2
    call_timeout_s: Doc(float, "wall-clock budget of one reset/step/solution/close call") = 5.0
    open_timeout_s: Doc(float, "wall-clock budget of open: module load + instantiate") = 10.0
    boot_timeout_s: Doc(float, "wall-clock budget for a worker to start and say ready") = 20.0
    capacity_wait_s: Doc(float, "how long open waits for a free worker slot before 'busy'") = 60.0
    memory_mb: Doc(int, "address-space limit of a worker (RLIMIT_AS), MB") = 1024
    cpu_seconds: Doc(int, "CPU-time limit over a worker's life (RLIMIT_CPU), seconds") = 3600
    file_mb: Doc(int, "largest file a worker may write (RLIMIT_FSIZE), MB") = 16
    tmp_mb: Doc(int, "size of the private tmpfs /tmp under bubblewrap, MB") = 64
    shm_mb: Doc(int, "size of the private tmpfs /dev/shm in the sandbox, MB") = 1
    open_files: Doc(int, "open file descriptors per worker (RLIMIT_NOFILE)") = 64
    nproc: Doc(
        int,
        "tasks (processes + threads) per worker: its pids cgroup's pids.max, and RLIMIT_NPROC "
        "(which does not bind root; tasks.py says which limit is in force)",
    ) = 64
    deny_fork: Doc(bool, "seccomp filter: no process creation, no signals to others") = True
    max_obs_chars: Doc(int, "largest observation (and solution) in characters") = 1_000_000
    max_info_bytes: Doc(int, "largest info dict (and tool list), msgpack-encoded bytes") = 262_144
    sink_chars: Doc(int, "characters of environment stdout/stderr kept in the worker") = 4096
    workers_per_env: Doc(
        int,
        "most workers one slow environment's instances are spread over (each worker still "
        "holds one environment only); 1 = every instance of an environment in one worker; "
        "0 = auto: one worker per open instance, within the environment's fair share of "
        "max_workers (max_workers / environments with open instances)",
    ) = 0
    spread_step_ms: Doc(
        float,
        "spread an environment over more workers only once its measured mean step time is "
        "above this many ms (fast steps gain nothing from extra workers); 0 = always",
    ) = 5.0
    packages: Doc(
        tuple[str, ...],
        "installed distributions (with their requirements) that environment code may import, "
        "bound read-only into bubblewrap workers; empty = standard library only, as "
        "docs/environments.md requires of generated environments",
    ) = ()


@dataclass(eq=False)
class Instance:
    """Handle of one environment instance (returned by ``EnvPool.open``)."""

    id: int
    env_id: str
    env_class: str
    worker: WorkerProcess = field(repr=False)


def source_id(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def static_class(source: str) -> str:
    """The environment class the static stage finds ("" when it finds none: such a file
    fails at load, where the worker's own search gives the reason)."""
    try:
        return find_env_class(ast.parse(source.removeprefix("\ufeff")))
    except (SyntaxError, ValueError, RecursionError, MemoryError, StructureError):
        return ""


class EnvPool:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self.isolation = "?"
        self._limits = {
            k: getattr(self.config, k)
            for k in ("memory_mb", "cpu_seconds", "file_mb", "tmp_mb", "shm_mb", "open_files", "nproc",
                      "deny_fork", "max_obs_chars", "max_info_bytes", "sink_chars")
        }  # fmt: skip
        self._limits["packages"] = package_binds(tuple(self.config.packages))
        # a reply holds at most one observation + one info + framing
        self._max_frame = 4 * self.config.max_obs_chars + self.config.max_info_bytes + 4096
        self._ids = itertools.count(1)
        self._idle: list[WorkerProcess] = []
        self._by_env: dict[str, list[WorkerProcess]] = {}
        self._classes: dict[str, str] = {}  # env_id -> static class name (the Open message)
        self._step_ms: dict[str, float] = {}  # env_id -> mean step time (EMA), ms
        self._pinned: set[str] = set()  # env_ids whose idle workers are never evicted
        self._starting = 0
        self._env_locks: dict[str, anyio.Lock] = {}
        self._reserve_lock = anyio.Lock()
        self._changed = anyio.Event()
        self._want_spawn = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._warned_seccomp = False
        self.counters = {"spawned": 0, "killed": 0, "died": 0, "opened": 0, "closed": 0, "calls": 0}

    # --- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> EnvPool:
        fix_mmap_threshold()  # megabyte reply frames must not ratchet the heap (process.py)
        self.isolation = await anyio.to_thread.run_sync(
            sandbox.isolation_level, self.config.isolation
        )
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self.config.prewarm > 0:
            await self._tg.start(self._prewarmer)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._sweep()
        await self._tg.__aexit__(None, None, None)
        await self._sweep()  # a prewarm boot that finished during the first sweep

    async def _sweep(self) -> None:
        with anyio.CancelScope(shield=True):
            for w in [*self._idle, *self._env_workers()]:
                await w.kill("pool closed")
            self._idle.clear()
            self._by_env.clear()

    def detached_worker(self) -> WorkerProcess:
        """A worker configured like the pool's but not managed by it (benchmarks, tests):
        the caller starts it (``await w.start(timeout)``) and must ``await w.kill(why)``."""
        return WorkerProcess(self.isolation, self._limits, self._max_frame)

    def _env_workers(self) -> list[WorkerProcess]:
        return [w for ws in self._by_env.values() for w in ws]

    def _live(self) -> int:
        return len(self._idle) + len(self._env_workers()) + self._starting

    async def _new_worker(self) -> WorkerProcess:
        self._starting += 1
        try:
            w = WorkerProcess(self.isolation, self._limits, self._max_frame)
            await w.start(self.config.boot_timeout_s)
            self.counters["spawned"] += 1
            if self.config.deny_fork and not w.seccomp and not self._warned_seccomp:
                self._warned_seccomp = True
                log.warning("no seccomp filter on this platform: environments CAN fork and signal")
            return w
        finally:
            self._starting -= 1
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _prewarmer(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            # sequential: one spawn at a time, so _starting needs no counting here (a worker
            # that open() is starting directly is not going to be idle)
            while len(self._idle) < self.config.prewarm:
                if self._live() >= self.config.max_workers:
                    # new environments (the common case in SPADE) need a clean worker more
                    # than a closed environment needs to stay loaded: evict one, LRU
                    spare = self._spare()
                    if spare is None:
                        break
                    await self._evict(spare)
                    continue
                w = await self._new_worker()  # (not `_idle.append(await ...)`: binds first)
                self._idle.append(w)
                self._notify()
            if not started:
                started = True
                task_status.started()
            await self._want_spawn.wait()
            self._want_spawn = anyio.Event()

    def _reap(self, w: WorkerProcess) -> None:
        """Forget a dead worker so its slot frees up, and top the idle set up again."""
        ws = self._by_env.get(w.env_id) if w.env_id is not None else None
        if ws is not None and w in ws:
            ws.remove(w)
            if not ws:
                del self._by_env[w.env_id]
                self._forget(w.env_id)  # a crashed environment's class, timings and lock
            self.counters["died"] += 1
        self._want_spawn.set()
        self._notify()

    # --- worker assignment -----------------------------------------------------------
    def _spare(self) -> WorkerProcess | None:
        """The least recently used environment worker without open instances, if any."""
        spare = [
            w for w in self._env_workers()
            if not w.instances and not w.opening and not w.lock.locked()
            and w.env_id not in self._pinned
        ]  # fmt: skip
        return min(spare, key=lambda w: w.last_used) if spare else None

    async def _evict(self, w: WorkerProcess) -> None:
        """Kill one environment worker without open instances (its slot is needed)."""
        ws = self._by_env.get(w.env_id, [])
        if w in ws:
            ws.remove(w)
            if not ws:
                del self._by_env[w.env_id]
        if not ws:
            self._forget(w.env_id)
        await w.kill(f"environment {w.env_id} evicted")
        self.counters["killed"] += 1
        self._want_spawn.set()
        self._notify()

    def _slow(self, env_id: str) -> bool:
        return self._step_ms.get(env_id, 0.0) > self.config.spread_step_ms or (
            self.config.spread_step_ms <= 0
        )

    def _spread_cap(self) -> int:
        """How many workers one environment may be spread over: ``workers_per_env``, or in
        auto (0) its fair share of ``max_workers`` among the environments that have an
        instance open (or opening) now, so one slow environment's group cannot take the
        slots the others' plays need (spreading never evicts or waits; a new environment
        may evict a spread worker once its instances closed)."""
        if self.config.workers_per_env > 0:
            return self.config.workers_per_env
        active = sum(1 for ws in self._by_env.values() if any(x.instances or x.opening for x in ws))
        return max(1, self.config.max_workers // max(1, active))

    async def _another_worker(self, env_id: str) -> WorkerProcess | None:
        """One more worker for ``env_id`` (spreading a slow environment): a pre-warmed one
        or a free slot, never by evicting (another environment's loaded worker may be costly
        to boot again: package imports) or waiting; None when there is neither."""
        self._idle[:] = [x for x in self._idle if not x.dead]
        if self._idle:
            w = self._idle.pop()
            self._want_spawn.set()
        elif self._live() < self.config.max_workers:
            w = await self._new_worker()
        else:
            return None
        w.env_id = env_id
        self._by_env.setdefault(env_id, []).append(w)
        return w

    async def _placement(self, env_id: str) -> WorkerProcess:
        """The worker a new instance of ``env_id`` goes to: the least loaded of its workers,
        or one more of them when all are in use and its steps are slow."""
        ws = [w for w in self._by_env.get(env_id, []) if not w.dead]
        if not ws:
            return await self._worker_for(env_id)
        w = min(ws, key=lambda x: len(x.instances) + x.opening)
        if len(w.instances) + w.opening and len(ws) < self._spread_cap() and self._slow(env_id):
            more = await self._another_worker(env_id)
            if more is not None:
                return more
        return w

    async def _worker_for(self, env_id: str) -> WorkerProcess:
        ws = [w for w in self._by_env.get(env_id, []) if not w.dead]
        if ws:
            return ws[0]
        with anyio.fail_after(self.config.capacity_wait_s):
            while True:
                self._idle[:] = [x for x in self._idle if not x.dead]
                if self._idle:
                    w = self._idle.pop()
                    self._want_spawn.set()
                    break
                if self._live() < self.config.max_workers:
                    w = await self._new_worker()
                    break
                spare = self._spare()
                if spare is not None:
                    await self._evict(spare)
                    continue
                await self._changed.wait()
        w.env_id = env_id
        self._by_env[env_id] = [w]
        return w

    async def reserve(self, *env_ids: str) -> None:
        """A worker of its own for each of ``env_ids``, taken one caller at a time, so two
        callers that each need several workers cannot each hold one and wait forever.
        (The validator's two-process gates; the booting happens concurrently.)"""
        errors: list[EnvError] = []

        async def one(env_id: str) -> None:
            try:
                await self._assign(env_id)
            except EnvError as exc:
                errors.append(exc)

        async with self._reserve_lock:
            async with anyio.create_task_group() as tg:
                for env_id in env_ids:
                    tg.start_soon(one, env_id)
        if errors:
            raise errors[0]

    async def _assign(self, env_id: str, spread: bool = False) -> WorkerProcess:
        try:
            return await self._assign_locked(env_id, spread)
        finally:  # a worker that died while the lock was held left the lock behind
            if env_id not in self._by_env:
                self._forget(env_id)

    async def _assign_locked(self, env_id: str, spread: bool) -> WorkerProcess:
        async with self._env_locks.setdefault(env_id, anyio.Lock()):
            try:
                return await (self._placement if spread else self._worker_for)(env_id)
            except TimeoutError:
                raise EnvError(
                    "busy",
                    f"no worker slot within {self.config.capacity_wait_s:g} s (max_workers={self.config.max_workers})",
                ) from None

    def _forget(self, env_id: str) -> None:
        """Drop what the pool keeps per environment once it has no worker (a long run
        validates thousands of environments under fresh ids)."""
        self._classes.pop(env_id, None)
        self._step_ms.pop(env_id, None)
        lock = self._env_locks.get(env_id)
        if lock is not None and not lock.locked() and not lock.statistics().tasks_waiting:
            del self._env_locks[env_id]

    def pin(self, env_id: str) -> None:
        """Keep ``env_id``'s workers loaded between its instances (the validator's A and B:
        "the worker where solution() ran" must stay one process) until ``unpin``."""
        self._pinned.add(env_id)

    def unpin(self, env_id: str) -> None:
        self._pinned.discard(env_id)
        self._want_spawn.set()

    async def release(self, env_id: str) -> None:
        """Kill the workers of ``env_id`` (its instances become lost)."""
        ws = self._by_env.pop(env_id, [])
        self._forget(env_id)
        for w in ws:
            await w.kill(f"environment {env_id} released")
            self.counters["killed"] += 1
        if ws:
            self._want_spawn.set()
            self._notify()

    # --- calls -----------------------------------------------------------------------
    async def _call(self, w: WorkerProcess, msg: object, timeout: float) -> Any:
        self.counters["calls"] += 1
        try:
            reply = await w.request(msg, timeout)
        except EnvError:
            if w.dead:
                self._reap(w)
            raise
        if isinstance(msg, P.Step) and w.env_id in self._by_env:  # the time it was busy
            ms = w.busy_s * 1000
            old = self._step_ms.get(w.env_id)
            self._step_ms[w.env_id] = ms if old is None else 0.8 * old + 0.2 * ms
        return reply

    async def open(
        self, source: str, env_id: str | None = None, kwargs: dict | None = None,
        env_class: str = "", beside: Instance | None = None,
    ) -> Instance:  # fmt: skip
        """An instance of ``source``'s environment class (``env_class``: load that class by
        name, as the static stage found it; by default the pool finds it the same way).
        ``beside``: open it in that instance's worker (a second instance in one process).

        Every ``Open`` a worker sees has the same shape, whoever asks (the validator or
        training): the worker's own random 16-hex id, never the caller's ``env_id``, and
        the static class name, so environment code cannot tell validation from training.
        """
        env_id = env_id or source_id(source)
        if beside is not None:
            if beside.env_id != env_id:
                raise ValueError(f"beside= is an instance of {beside.env_id}, not of {env_id}")
            w = self._check(beside)
        else:  # one worker per environment (more when it is slow), even opened concurrently
            w = await self._assign(env_id, spread=True)
        if not env_class:
            env_class = self._classes.get(env_id) or static_class(source)
            if env_id in self._by_env:  # kept while the environment has a worker only
                self._classes[env_id] = env_class
        iid = next(self._ids)
        w.opening += 1
        try:
            reply = await self._call(
                w, P.Open(iid, w.wire_id, source, kwargs or {}, env_class),
                self.config.open_timeout_s,
            )  # fmt: skip
        finally:
            w.opening -= 1
        w.instances.add(iid)
        self.counters["opened"] += 1
        return Instance(iid, env_id, reply.env_class, w)

    def _check(self, inst: Instance) -> WorkerProcess:
        w = inst.worker
        if w.dead:
            raise EnvError("lost", f"instance {inst.id} of {inst.env_id} was lost: {w.dead}")
        if inst.id not in w.instances:
            raise EnvError("lost", f"instance {inst.id} is closed")
        return w

    async def reset(self, inst: Instance, seed: int | None = None) -> tuple[str, dict]:
        r = await self._call(self._check(inst), P.Reset(inst.id, seed), self.config.call_timeout_s)
        return r.obs, r.info

    async def step(self, inst: Instance, action: str) -> tuple[str, float, bool, bool, dict]:
        r = await self._call(self._check(inst), P.Step(inst.id, action), self.config.call_timeout_s)
        return r.obs, r.reward, r.terminated, r.truncated, r.info

    async def solution(self, inst: Instance) -> str | list[str]:
        r = await self._call(self._check(inst), P.Solution(inst.id), self.config.call_timeout_s)
        return r.value

    async def get_tools(self, inst: Instance) -> list[dict]:
        r = await self._call(self._check(inst), P.GetTools(inst.id), self.config.call_timeout_s)
        return r.value

    async def close(self, inst: Instance) -> None:
        """Close an instance; never raises for a lost one (closing is cleanup)."""
        w = inst.worker
        if w.dead or inst.id not in w.instances:
            return
        w.instances.discard(inst.id)
        self.counters["closed"] += 1
        try:
            await self._call(w, P.Close(inst.id), self.config.call_timeout_s)
        except EnvError:
            pass  # a close() that raises or hangs is the environment's problem, not ours
        if not w.instances:
            self._want_spawn.set()  # its slot may now be evicted to keep the prewarm reserve
        self._notify()

    def stats(self) -> dict[str, Any]:
        """Counters for the dashboard."""
        env_workers = self._env_workers()
        return {
            "isolation": self.isolation,
            "task_limit": tasks.mode(),
            "workers": self._live(),
            "idle": len(self._idle),
            "busy": sum(1 for w in env_workers if w.lock.locked()),
            "env_workers": len(env_workers),
            "instances": sum(len(w.instances) for w in env_workers),
            # environments the pool keeps state for (class, step time, lock): those with a
            # worker, and the few being assigned one; a long run must not grow it
            "env_state": len(self._env_locks.keys() | self._classes.keys() | self._step_ms.keys()),
            "max_workers": self.config.max_workers,
            **self.counters,
            "pids": [w.pid for w in [*self._idle, *env_workers] if w.pid],
        }
