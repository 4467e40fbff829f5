"""Issue 22 in the pool: a task limit that binds for root, the same Open for every caller,
slow environments spread over several workers (never two environments in one worker)."""

from __future__ import annotations

import hashlib
import os
import time

import anyio
import pytest

from spade_async.envs import tasks
from spade_async.envs.pool import EnvError, EnvPool, PoolConfig

pytestmark = pytest.mark.anyio

FLOOD = """
import threading
STOP = threading.Event()
HELD = []
class FloodEnv:
    def reset(self, seed=None):
        threading.stack_size(64 << 10)
        try:
            while len(HELD) < 300:
                t = threading.Thread(target=STOP.wait, daemon=True)
                t.start()
                HELD.append(t)
        except RuntimeError as exc:
            return f"held {len(HELD)}: {exc}", {}
        return f"held {len(HELD)}", {}
    def step(self, a):
        return "x", 0.0, False, False, {}
"""

SHAPE = """
import sys
class ShapeEnv:
    def __init__(self, **kwargs):
        f = sys._getframe(1)
        while f is not None and not hasattr(f.f_locals.get("msg"), "env_id"):
            f = f.f_back
        msg = f.f_locals["msg"]
        self.seen = f"{len(msg.env_id)}|{msg.env_class}|{msg.env_id}"
    def reset(self, seed=None):
        return self.seen, {}
    def step(self, a):
        return "x", 0.0, False, False, {}
"""

SLOW = """
import time
class SlowEnv:
    def reset(self, seed=None):
        return "slow", {}
    def step(self, a):
        time.sleep(0.05)
        return "x", 0.0, False, False, {}
"""


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture
def no_cgroup(monkeypatch):
    """The fallback where no pids cgroup can be made (tasks.cgroups() is cached)."""
    monkeypatch.setenv("SPADE_NO_PIDS_CGROUP", "1")
    tasks.cgroups.cache_clear()
    yield
    monkeypatch.delenv("SPADE_NO_PIDS_CGROUP")
    tasks.cgroups.cache_clear()


async def _held(cfg: PoolConfig) -> tuple[str, str]:
    async with EnvPool(cfg) as pool:
        inst = await pool.open(FLOOD)
        try:
            obs = (await pool.reset(inst, 0))[0]
        except EnvError as exc:
            obs = exc.message
        return obs, pool.stats()["task_limit"]


async def test_thread_flood_is_capped_by_the_task_limit():
    obs, mode = await _held(PoolConfig(prewarm=0, max_workers=2, nproc=24))
    assert mode == tasks.mode()
    assert "can't start new thread" in obs, obs
    if mode == "pids-cgroup":  # the worker's main thread, bwrap's two and a shell count too
        held = int(obs.split()[1].rstrip(":"))
        assert 0 < held <= 24, obs


async def test_without_a_cgroup_root_gets_no_threads(no_cgroup):
    obs, mode = await _held(PoolConfig(prewarm=0, max_workers=2, nproc=24))
    assert mode == ("no-threads" if os.geteuid() == 0 else "rlimit-nproc")
    assert "can't start new thread" in obs, obs
    if mode == "no-threads":
        assert obs.startswith("held 0"), obs


async def test_worker_cgroups_are_removed():
    made = tasks.cgroups()
    if made is None:
        pytest.skip("no pids cgroup here")
    async with EnvPool(PoolConfig(prewarm=1, max_workers=2)) as pool:
        inst = await pool.open(FLOOD.replace("300", "3"))
        leaf = inst.worker.cgroup
        assert leaf is not None and (leaf / "pids.max").read_text().strip() == "64"
        assert int((leaf / "pids.current").read_text()) >= 2
        await pool.reset(inst, 0)
    for _ in range(100):
        made.sweep()
        if not made.leftover():
            break
        time.sleep(0.02)
    assert made.leftover() == []


async def test_every_caller_opens_with_the_same_message():
    """Validation (a 16-hex id, the class name) and training (the memory's 64-hex id, no
    class name) look the same to the worker: its own random 16-hex id and the static name."""
    async with EnvPool(PoolConfig(prewarm=0, max_workers=3)) as pool:
        seen = []
        for env_id, env_class in (
            ("0123456789abcdef", "ShapeEnv"),
            (hashlib.sha256(SHAPE.encode()).hexdigest(), ""),
            (None, ""),
        ):
            inst = await pool.open(SHAPE, env_id=env_id, env_class=env_class)
            seen.append((await pool.reset(inst, 0))[0].split("|"))
            assert seen[-1][2] != env_id  # the caller's id never reaches the worker
            await pool.release(inst.env_id)
    assert {(n, c) for n, c, _ in seen} == {("16", "ShapeEnv")}, seen
    assert len({wire for _, _, wire in seen}) == 3  # random per worker


async def test_slow_environment_spreads_over_its_own_workers():
    cfg = PoolConfig(prewarm=0, max_workers=6, workers_per_env=3, spread_step_ms=10)
    async with EnvPool(cfg) as pool:
        first = await pool.open(SLOW)
        await pool.reset(first, 0)
        await pool.step(first, "x")  # measured: ~50 ms a step, above spread_step_ms
        group = [first] + [await pool.open(SLOW) for _ in range(5)]
        workers = {id(i.worker) for i in group}
        assert len(workers) == 3  # workers_per_env, each holding only this environment
        assert {i.worker.env_id for i in group} == {first.env_id}
        other = await pool.open(FLOOD.replace("300", "1"))
        assert id(other.worker) not in workers  # never two environments in one worker

        busy: list[int] = []

        async def play(inst) -> None:
            await pool.reset(inst, 0)
            await pool.step(inst, "x")
            busy.append(pool.stats()["busy"])

        async def watch() -> None:
            while len(busy) < len(group):
                busy.append(pool.stats()["busy"])
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            for inst in group:
                tg.start_soon(play, inst)
        assert max(busy) == 3  # the group's steps ran on three workers at once
        assert pool.stats()["env_workers"] == 4


async def test_auto_spread_takes_a_fair_share_of_the_pool():
    """workers_per_env = 0 (the default): a slow environment alone gets one worker per open
    instance; once a second environment has instances open, each is held to
    max_workers / 2, and spreading takes only free slots, never another's workers."""
    cfg = PoolConfig(prewarm=0, max_workers=8, spread_step_ms=10)
    assert cfg.workers_per_env == 0
    other_src = SLOW.replace("SlowEnv", "OtherSlowEnv")
    async with EnvPool(cfg) as pool:
        first = await pool.open(SLOW)
        await pool.reset(first, 0)
        await pool.step(first, "x")
        alone = [first] + [await pool.open(SLOW) for _ in range(3)]
        assert len({id(i.worker) for i in alone}) == 4  # one worker per instance
        for inst in alone[2:]:
            await pool.close(inst)  # two left open, on two workers (two spare)
        b0 = await pool.open(other_src)
        await pool.reset(b0, 0)
        await pool.step(b0, "x")
        second = [b0] + [await pool.open(other_src) for _ in range(4)]
        b_workers = {id(i.worker) for i in second}
        assert len(b_workers) == 4  # max_workers 8 / 2 environments with instances open
        assert {i.worker.env_id for i in second} == {b0.env_id}
        a_more = [await pool.open(SLOW) for _ in range(3)]
        a_workers = {id(i.worker) for i in alone[:2] + a_more}
        assert len(a_workers) == 4 and not a_workers & b_workers
        assert pool.stats()["env_workers"] == 8


async def test_fast_environment_stays_in_one_worker():
    async with EnvPool(PoolConfig(prewarm=2, max_workers=6, workers_per_env=4)) as pool:
        fast = SLOW.replace("time.sleep(0.05)", "pass")
        first = await pool.open(fast)
        await pool.reset(first, 0)
        await pool.step(first, "x")
        group = [first] + [await pool.open(fast) for _ in range(5)]
        assert len({id(i.worker) for i in group}) == 1
