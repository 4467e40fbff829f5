"""EnvPool: isolation reported, shared/separate workers, timeouts kill the process group,
dead workers replaced, bounded concurrency, output caps, a stdout that imitates the wire."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import anyio
import pytest

from spade_async.envs import sandbox
from spade_async.envs.pool import EnvError, EnvPool, PoolConfig

pytestmark = pytest.mark.anyio

COUNTER = """
class CounterEnv:
    def __init__(self, max_turns=5, start=0, **kwargs):
        self.max_turns, self.start = max_turns, start
    def reset(self, seed=None):
        self.n, self.t = self.start + (seed or 0), 0
        return f"n={self.n}", {"seed": seed}
    def step(self, action):
        self.n += 1
        self.t += 1
        return f"n={self.n}", 0.5, False, self.t >= self.max_turns, {"action": action}
    def solution(self):
        return ["a", "b"]
"""


def variant(tag: str, body: str = "") -> str:
    """A distinct environment (different source -> different env_id -> different worker)."""
    return COUNTER.replace("class CounterEnv:", f"# {tag}\nclass CounterEnv:") + body


async def wait_gone(tag: str) -> None:
    """All processes of a worker exit (those in its pid namespace die asynchronously)."""
    for _ in range(300):
        if not sandbox.find_pids(tag):
            break
        await anyio.sleep(0.01)
    assert sandbox.find_pids(tag) == []


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
async def pool():
    async with EnvPool(PoolConfig(call_timeout_s=1.0, open_timeout_s=2.0, prewarm=2)) as p:
        yield p


async def test_isolation_reported(pool):
    assert pool.isolation in sandbox.LEVELS
    assert pool.isolation == sandbox.isolation_level("auto")
    assert pool.stats()["isolation"] == pool.isolation
    if sandbox.probe_all()["bwrap"] is None:
        assert pool.isolation == "bwrap"


async def test_reset_step_solution_close(pool):
    inst = await pool.open(COUNTER, kwargs={"start": 10})
    assert inst.env_class == "CounterEnv"
    assert await pool.reset(inst, 2) == ("n=12", {"seed": 2})
    obs, reward, term, trunc, info = await pool.step(inst, "go")
    assert (obs, reward, term, trunc, info) == ("n=13", 0.5, False, False, {"action": "go"})
    assert await pool.solution(inst) == ["a", "b"]
    assert await pool.get_tools(inst) == []
    await pool.close(inst)
    with pytest.raises(EnvError) as err:
        await pool.step(inst, "x")
    assert err.value.kind == "lost"


async def test_instances_share_a_worker_envs_do_not(pool):
    a1, a2 = await pool.open(variant("A")), await pool.open(variant("A"))
    b = await pool.open(variant("B"))
    assert a1.worker is a2.worker and a1.env_id == a2.env_id
    assert b.worker is not a1.worker and b.worker.pid != a1.worker.pid
    await pool.reset(a1, 0)
    await pool.reset(a2, 100)
    await pool.step(a1, "x")
    assert (await pool.step(a2, "x"))[0] == "n=101"  # instances keep separate state
    for inst in (a1, a2, b):
        await pool.close(inst)


async def test_timeout_kills_whole_process_group(pool):
    src = variant("T", "\nimport time\nCounterEnv.step = lambda self, a: time.sleep(60)\n")
    inst = await pool.open(src)
    await pool.reset(inst, 0)
    tag = inst.worker.tag
    assert sandbox.find_pids(tag), "worker processes should be visible before the timeout"
    t0 = time.monotonic()
    with pytest.raises(EnvError) as err:
        await pool.step(inst, "x")
    assert err.value.kind == "timeout"
    assert time.monotonic() - t0 < 5.0
    await wait_gone(tag)
    with pytest.raises(EnvError) as err:
        await pool.reset(inst, 0)
    assert err.value.kind == "lost"


async def test_killed_worker_is_replaced(pool):
    src = variant("K")
    inst = await pool.open(src)
    await pool.reset(inst, 0)
    old_pid, died = inst.worker.pid, pool.stats()["died"]
    os.killpg(old_pid, signal.SIGKILL)  # someone kills the worker from outside
    await wait_gone(inst.worker.tag)
    with pytest.raises(EnvError) as err:
        await pool.step(inst, "x")
    assert err.value.kind == "crash"
    assert pool.stats()["died"] == died + 1
    again = await pool.open(src)  # the same environment gets a fresh worker
    assert again.worker.pid != old_pid
    assert await pool.reset(again, 1) == ("n=1", {"seed": 1})
    await pool.close(again)
    with anyio.fail_after(10):  # the idle pre-warmed set is topped up again
        while pool.stats()["idle"] < 2:
            await anyio.sleep(0.01)


async def test_output_caps_and_fake_frames_on_stdout():
    noisy = variant(
        "N",
        """
import os, sys, struct
def _step(self, action):
    fake = struct.pack("<I", 5) + b"\\x95\\xa7step_ok"
    print(fake.decode("latin-1") * 1000)
    sys.stderr.write("x" * 100000)
    os.write(1, fake * 1000)
    os.write(2, fake * 1000)
    return "real", 1.0, True, False, {}
CounterEnv.step = _step
CounterEnv.reset = lambda self, seed=None: ("y" * 5000, {}) if seed == 9 else ("ok", {})
""",
    )
    async with EnvPool(PoolConfig(prewarm=0, max_workers=2, max_obs_chars=1000)) as pool:
        inst = await pool.open(noisy)
        await pool.reset(inst, 0)
        assert await pool.step(inst, "x") == ("real", 1.0, True, False, {})
        with pytest.raises(EnvError) as err:
            await pool.reset(inst, 9)
        assert err.value.kind == "output_too_large"
        assert (await pool.reset(inst, 0))[0] == "ok"  # the worker survives a refused reply


async def test_bounded_concurrency_and_eviction():
    cfg = PoolConfig(prewarm=0, max_workers=2, capacity_wait_s=0.5)
    async with EnvPool(cfg) as pool:
        a, b = await pool.open(variant("c1")), await pool.open(variant("c2"))
        assert pool.stats()["workers"] == 2
        with pytest.raises(EnvError) as err:
            await pool.open(variant("c3"))
        assert err.value.kind == "busy"
        await pool.close(a)  # c1's worker has no instance left: it may be evicted
        c = await pool.open(variant("c3"))
        assert pool.stats()["workers"] == 2
        assert c.worker.pid not in (a.worker.pid, b.worker.pid)
        assert (await pool.reset(b, 3))[0] == "n=3"


async def test_many_concurrent_instances_one_env():
    async with EnvPool(PoolConfig(prewarm=1, max_workers=4)) as pool:

        async def play(i: int, out: dict) -> None:
            inst = await pool.open(COUNTER)
            await pool.reset(inst, i)
            for _ in range(3):
                obs = (await pool.step(inst, "x"))[0]
            out[i] = obs
            await pool.close(inst)

        out: dict[int, str] = {}
        async with anyio.create_task_group() as tg:
            for i in range(32):
                tg.start_soon(play, i, out)
        assert out == {i: f"n={i + 3}" for i in range(32)}
        assert pool.stats()["env_workers"] == 1


async def test_no_process_creation_but_threads_work(pool):
    src = variant(
        "F",
        """
import os, threading
def _reset(self, seed=None):
    box = []
    t = threading.Thread(target=lambda: box.append("thread ok"))
    t.start()
    t.join()
    try:
        os.fork()
        forked = "forked"
    except PermissionError:
        forked = "fork denied"
    try:
        os.kill(1, 0)
        signalled = "signalled pid 1"
    except (PermissionError, ProcessLookupError):
        signalled = "kill denied"
    return f"{box[0]}, {forked}, {signalled}", {}
CounterEnv.reset = _reset
""",
    )
    inst = await pool.open(src)
    if pool.stats()["task_limit"] == "no-threads":  # root without a pids cgroup (tasks.py)
        with pytest.raises(EnvError, match="can't start new thread"):
            await pool.reset(inst, 0)
    else:
        obs, _ = await pool.reset(inst, 0)
        if inst.worker.seccomp:
            assert obs == "thread ok, fork denied, kill denied"
    await pool.close(inst)


@pytest.mark.parametrize("level", ["unshare", "rlimit"])
async def test_fallback_levels(level):
    if sandbox.probe_all()[level] is not None:
        pytest.skip(f"{level} does not work here: {sandbox.probe_all()[level]}")
    selfkill = variant(
        "S", "\nimport os\nCounterEnv.step = lambda self, a: os.kill(os.getpid(), 9)\n"
    )
    async with EnvPool(PoolConfig(isolation=level, prewarm=0, max_workers=2)) as pool:
        assert pool.isolation == level
        inst = await pool.open(selfkill)
        assert await pool.reset(inst, 4) == ("n=4", {"seed": 4})
        with pytest.raises(EnvError) as err:
            await pool.step(inst, "x")
        assert err.value.kind == "crash" and "SIGKILL" in err.value.message
    if level == "rlimit":
        assert sandbox._warned  # the weak level was announced (logged once per process)


CONTROLLER = """
import anyio
from spade_async.envs.pool import EnvPool, PoolConfig
SPIN = "class SpinEnv:\\n    def reset(self, seed=None):\\n        while True: pass\\n    def step(self, a): pass\\n"
async def main():
    async with EnvPool(PoolConfig(prewarm=1, call_timeout_s=60)) as pool:
        inst = await pool.open(SPIN)
        print(inst.worker.tag, pool._idle[0].tag if pool._idle else "", flush=True)
        await pool.reset(inst, 0)
anyio.run(main)
"""


def test_workers_die_with_a_killed_controller():
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True)
    try:
        tags = proc.stdout.readline().split()
        assert tags and all(sandbox.find_pids(t) for t in tags)
        time.sleep(0.2)  # the worker is now spinning in reset()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 5
    while any(sandbox.find_pids(t) for t in tags) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [sandbox.find_pids(t) for t in tags] == [[] for _ in tags]


async def test_forged_frame_on_the_reply_pipe_kills_only_that_worker(pool):
    forger = variant(
        "X",
        """
import os, sys
def _step(self, action):
    os.write(int(sys.argv[2]), b"\\x05\\x00\\x00\\x00\\xc1\\xc1\\xc1\\xc1\\xc1")
    return "o", 0.0, False, False, {}
CounterEnv.step = _step
""",
    )
    bad, good = await pool.open(forger), await pool.open(variant("Y"))
    await pool.reset(bad, 0)
    with pytest.raises(EnvError) as err:
        await pool.step(bad, "x")
    assert err.value.kind == "protocol" and "reply frame numbered" in err.value.message
    await wait_gone(bad.worker.tag)
    await pool.reset(good, 0)
    assert (await pool.step(good, "x"))[0] == "n=1"
    await pool.close(good)


def _step_ok(reward: bytes = b"\xcb" + bytes(8), info: bytes = b"\x80") -> bytes:
    """A StepOk frame body written by hand: [tag, obs 'x', reward, False, False, info]."""
    return b"\x96\xa7step_ok\xa1x" + reward + b"\xc2\xc2" + info


# raw reply body -> (kind the parent reports, words of its reason)
RAW_REPLIES = {
    "nested": (_step_ok(info=b"\x81\xa1k" + b"\x91" * 200_000 + b"\xc0"), "protocol", "corrupt"),
    "ext": (_step_ok(info=b"\x81\xa1k\xd4\x05\x00"), "protocol", "extension type 5"),
    "timestamp": (_step_ok(info=b"\x81\xa1k\xd6\xff\x00\x00\x00\x01"), "contract", "datetime"),
    "nan": (_step_ok(reward=b"\xcb\x7f\xf8" + bytes(6)), "contract", "outside [-10, 10]"),
    "huge": (_step_ok(reward=b"\xcb\xc1\x2e\x84\x80" + bytes(4)), "contract", "-1000000.0"),
    "wrong_type": (b"\x92\xa6opened\xaaCounterEnv", "protocol", "Opened answered Step"),
    "bad_err_kind": (b"\x93\xa3err\xa7timeout\xa1x", "protocol", "kind 'timeout'"),
}


@pytest.mark.parametrize("case", list(RAW_REPLIES))
async def test_the_parent_refuses_replies_the_worker_never_checked(pool, case):
    """The environment replaces the worker's send(): whatever bytes it puts on the wire,
    the parent checks them itself, reports why, and kills that worker only."""
    raw, kind, words = RAW_REPLIES[case]
    patch = f"""
import os, sys
_W, _P = sys.modules["__main__"].Worker, sys.modules["protocol"]
_send = _W.send
def _raw_send(self, msg, seq):
    if isinstance(msg, (_P.StepOk, _P.Err)) and not getattr(self, "_raw_sent", False):
        self._raw_sent = True
        payload = bytes.fromhex("{raw.hex()}")
        os.write(self.wfd, _P.HEADER.pack(len(payload), seq) + payload)
    else:
        _send(self, msg, seq)
_W.send = _raw_send
"""
    bad, good = await pool.open(variant(f"raw-{case}", patch)), await pool.open(variant("Z"))
    await pool.reset(bad, 0)
    with pytest.raises(EnvError) as err:
        await pool.step(bad, "x")
    assert err.value.kind == kind and words in err.value.message, err.value
    await wait_gone(bad.worker.tag)
    await pool.reset(good, 0)
    assert (await pool.step(good, "x"))[0] == "n=1"
    await pool.close(good)


async def test_per_environment_state_does_not_outlive_its_workers():
    """A long run opens thousands of environments that crash, are evicted or released: the
    pool's per-environment state (static class, step time, assignment lock) is dropped
    with an environment's last worker (the soak's parent RSS grew while crashed
    environments' entries piled up)."""
    crashing = COUNTER.replace("self.n += 1", "__import__('os')._exit(3)")
    cfg = PoolConfig(call_timeout_s=2.0, open_timeout_s=5.0, prewarm=1, max_workers=3)
    async with EnvPool(cfg) as pool:
        for i in range(6):
            inst = await pool.open(
                crashing.replace("class CounterEnv:", f"# c{i}\nclass CounterEnv:")
            )
            await pool.reset(inst, 0)
            with pytest.raises(EnvError):
                await pool.step(inst, "x")  # the worker dies
        for i in range(6):  # more environments than slots: the older ones are evicted
            inst = await pool.open(variant(f"e{i}"))
            await pool.reset(inst, 0)
            await pool.step(inst, "x")
            await pool.close(inst)
        assert _env_state(pool) <= set(pool._by_env), _env_state(pool) - set(pool._by_env)
        assert pool.stats()["env_state"] == len(_env_state(pool))
        for env_id in list(pool._by_env):
            await pool.release(env_id)
        assert _env_state(pool) == set()


def _env_state(pool) -> set[str]:
    return set(pool._env_locks) | set(pool._classes) | set(pool._step_ms)


def test_mmap_threshold_is_pinned_once():
    """glibc's dynamic mmap threshold is pinned (mallopt) so megabyte reply frames do not
    ratchet the controller's heap; idempotent, and a no-op where there is no glibc."""
    from spade_async.envs import process

    first = process.fix_mmap_threshold()
    assert process.fix_mmap_threshold() is first
    if sys.platform.startswith("linux") and os.path.exists("/lib/x86_64-linux-gnu/libc.so.6"):
        assert first or "MALLOC_MMAP_THRESHOLD_" in os.environ
