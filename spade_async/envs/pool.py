"""An anyio pool of sandboxed environment workers.

    async with EnvPool(PoolConfig()) as pool:
        inst = await pool.open(source)                 # env_id defaults to a source hash
        obs, info = await pool.reset(inst, seed=0)
        obs, reward, terminated, truncated, info = await pool.step(inst, r"\\boxed{go}")
        await pool.close(inst)

Rules: instances of one environment (``env_id``) share a worker; two environments never do.
At most ``max_workers`` processes live at once; ``prewarm`` clean workers wait booted, so an
``open`` of a new environment does not pay the interpreter start. A worker whose environment
has no open instance stays loaded (a later open is instant) until its slot is needed. Every
call has a wall-clock timeout; a timeout, crash or corrupt reply kills the worker's process
group and raises ``EnvError``; instances that lived on it then raise ``EnvError("lost")``.
The pool never lets one environment's failure stop another's calls.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import msgspec

from spade_async.config import Doc
from spade_async.envs import protocol as P
from spade_async.envs import sandbox
from spade_async.envs.packages import package_binds
from spade_async.envs.process import EnvError, WorkerProcess

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
    nproc: Doc(int, "RLIMIT_NPROC (not enforced for root; the seccomp filter stops forks)") = 64
    deny_fork: Doc(bool, "seccomp filter: no process creation, no signals to others") = True
    max_obs_chars: Doc(int, "largest observation (and solution) in characters") = 1_000_000
    max_info_bytes: Doc(int, "largest info dict (and tool list), msgpack-encoded bytes") = 262_144
    sink_chars: Doc(int, "characters of environment stdout/stderr kept in the worker") = 4096
    packages: Doc(
        tuple[str, ...],
        "installed distributions (with their requirements) that environment code may import, "
        "bound read-only into bubblewrap workers; empty = standard library only, as "
        "ENV_CONTRACT.md requires of generated environments",
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
        self._by_env: dict[str, WorkerProcess] = {}
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
            for w in [*self._idle, *self._by_env.values()]:
                await w.kill("pool closed")
            self._idle.clear()
            self._by_env.clear()

    def detached_worker(self) -> WorkerProcess:
        """A worker configured like the pool's but not managed by it (benchmarks, tests):
        the caller starts it (``await w.start(timeout)``) and must ``await w.kill(why)``."""
        return WorkerProcess(self.isolation, self._limits, self._max_frame)

    def _live(self) -> int:
        return len(self._idle) + len(self._by_env) + self._starting

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
                    await self.release(spare.env_id)
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
        if w.env_id is not None and self._by_env.get(w.env_id) is w:
            del self._by_env[w.env_id]
            self.counters["died"] += 1
        self._want_spawn.set()
        self._notify()

    # --- worker assignment -----------------------------------------------------------
    def _spare(self) -> WorkerProcess | None:
        """The least recently used environment worker without open instances, if any."""
        spare = [w for w in self._by_env.values() if not w.instances and not w.lock.locked()]
        return min(spare, key=lambda w: w.last_used) if spare else None

    async def _worker_for(self, env_id: str) -> WorkerProcess:
        w = self._by_env.get(env_id)
        if w is not None and not w.dead:
            return w
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
                    await self.release(spare.env_id)
                    continue
                await self._changed.wait()
        w.env_id = env_id
        self._by_env[env_id] = w
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

    async def _assign(self, env_id: str) -> None:
        async with self._env_locks.setdefault(env_id, anyio.Lock()):
            try:
                await self._worker_for(env_id)
            except TimeoutError:
                raise EnvError(
                    "busy",
                    f"no worker slot within {self.config.capacity_wait_s:g} s (max_workers={self.config.max_workers})",
                ) from None

    async def release(self, env_id: str) -> None:
        """Kill the worker of ``env_id`` (its instances become lost)."""
        w = self._by_env.pop(env_id, None)
        if w is not None:
            await w.kill(f"environment {env_id} released")
            self.counters["killed"] += 1
            self._want_spawn.set()
            self._notify()

    # --- calls -----------------------------------------------------------------------
    async def _call(self, w: WorkerProcess, msg: object, timeout: float) -> Any:
        self.counters["calls"] += 1
        try:
            return await w.request(msg, timeout)
        except EnvError:
            if w.dead:
                self._reap(w)
            raise

    async def open(
        self, source: str, env_id: str | None = None, kwargs: dict | None = None,
        env_class: str = "",
    ) -> Instance:  # fmt: skip
        """An instance of ``source``'s environment class (``env_class``: load that class by
        name, as the static stage found it, instead of searching the module)."""
        env_id = env_id or source_id(source)
        await self._assign(env_id)  # one worker per environment, even when opened concurrently
        w = self._by_env[env_id]
        iid = next(self._ids)
        reply = await self._call(
            w, P.Open(iid, env_id, source, kwargs or {}, env_class), self.config.open_timeout_s
        )
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
        env_workers = list(self._by_env.values())
        return {
            "isolation": self.isolation,
            "workers": self._live(),
            "idle": len(self._idle),
            "busy": sum(1 for w in env_workers if w.lock.locked()),
            "env_workers": len(env_workers),
            "instances": sum(len(w.instances) for w in env_workers),
            "max_workers": self.config.max_workers,
            **self.counters,
            "pids": [w.pid for w in [*self._idle, *env_workers] if w.pid],
        }
