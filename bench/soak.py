"""Soak: the environment pool under a mix of valid, hostile and crashing environments at
full concurrency for a set time, watching for anything that leaks.

    python bench/soak.py [--quick] [--minutes 20] [--interval 60] [--concurrency 8] [--save]

``--concurrency`` tasks loop until the time is up, each drawing one of:
- an episode of a valid environment (bundled examples, several copies under distinct
  sources so their workers come and go): open, reset(random seed), its solution or random
  play, close; any ``EnvError`` there is a LOST episode (target: zero);
- an episode of a crashing environment (``os._exit``, SIGKILL, SIGSEGV, a raise, a hang past
  the call timeout at a random step): the failure must come back as a classified error,
  and the worker is replaced;
- a validation check of a hostile (tests/hostile) or valid file: the verdict must be the
  expected one (a misjudged check is counted).

Every ``--interval`` seconds (a minute by default) it records checks/s, episodes/s, worker
restarts (spawned, died, killed), the RSS of the parent and of every worker process (the
whole sandbox: each worker's cgroup, or its process tree), the parent's open fds, host
``/dev/shm`` and ``Shmem`` usage, and the temp dirs the pool made. After the pool closes:
processes left (any process of this run's workers, and worker cgroups). Targets: zero lost
episodes, zero misjudged checks, zero processes left, parent RSS and open fds growing at
most 5% from the second interval to the end, ``/dev/shm`` back to its start. The last line
printed is one JSON object; ``--save`` writes bench/results/soak.json (soak_quick.json
with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import anyio
from _hw import emit, machine, refuse

from spade_async.envs import sandbox, tasks
from spade_async.envs.examples import HERE as EXAMPLES
from spade_async.envs.pool import EnvError, EnvPool, PoolConfig
from spade_async.envs.validate import solution_actions, validate_source

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "hostile"
VALID = ["mastermind.py", "modular_lock.py", "battleship.py", "order_ledger_tool.py"]
# hostile files that need no host-side trap, each rejected at every isolation level
REJECTED = [
    "os_exit.py", "sigkill_self.py", "sigsegv_self.py", "nan_reward.py", "trivially_won.py",
    "fork_bomb.py", "thread_flood.py", "memory_bomb.py", "loop_in_step.py",
    "huge_observation.py", "garbage_wins_later.py", "second_instance_differs.py",
    "forged_reply_frames.py", "probe_aware.py", "wrong_arity.py", "init_raises.py",
]  # fmt: skip
CRASHY = r'''
import ctypes, os, random, signal, time

class CrashyEnv:
    """Crashes in one of several ways at a seeded step."""
    def __init__(self, max_turns=20, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.at, self.how, self.turn = rng.randint(1, 4), rng.randrange(5), 0
        return f"step {self.at} ends this worker", {}
    def step(self, action):
        self.turn += 1
        if self.turn >= self.at:
            if self.how == 0:
                os._exit(3)
            if self.how == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == 2:
                ctypes.string_at(0)
            if self.how == 3:
                raise RuntimeError("environment bug")
            time.sleep(60)
        return "still here", 0.0, False, False, {}
'''
POOL = PoolConfig(
    max_workers=8, prewarm=2, call_timeout_s=2.0, open_timeout_s=4.0, memory_mb=512,
    capacity_wait_s=120.0,
)  # fmt: skip


def _render(name: str) -> str:
    src = (HOSTILE / name).read_text()
    return src.replace("__PORT__", "9").replace("__PATHS__", "[]").replace("__TARGETS__", "[]")


def _rss_kb(pid: int | str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a sandbox's processes live in a child pid namespace,
    but the host sees them as children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _shm() -> dict:
    st = os.statvfs("/dev/shm")
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    kb = next(
        int(ln.split()[1])
        for ln in Path("/proc/meminfo").read_text().splitlines()
        if ln.startswith("Shmem:")
    )
    return {"dev_shm_bytes": used, "shmem_kb": kb}


def _temp() -> dict:
    dirs = list(Path(tempfile.gettempdir()).glob("spade-env-*"))
    size = sum(f.stat().st_size for d in dirs for f in d.rglob("*") if f.is_file())
    return {"temp_dirs": len(dirs), "temp_bytes": size}


class Soak:
    def __init__(
        self, seconds: float, interval: float, concurrency: int, trace: bool = False
    ) -> None:
        self.seconds, self.interval, self.concurrency = seconds, interval, concurrency
        self.trace = trace
        if trace:
            tracemalloc.start(8)
        self.valid = [(EXAMPLES / n).read_text() for n in VALID]
        self.rejected = {n: _render(n) for n in REJECTED}
        self.n = dict.fromkeys(("checks", "episodes", "crash_episodes", "lost", "misjudged"), 0)
        self.errors: list[str] = []
        self.rng = random.Random(0)
        self.crashes = 0

    def valid_source(self) -> str:
        # distinct copies: distinct env_ids, so workers are loaded, evicted and replaced
        copy = self.rng.randrange(6)
        return f"# soak copy {copy}\n" + self.rng.choice(self.valid)

    async def episode(self, pool: EnvPool) -> None:
        source, inst = self.valid_source(), None
        try:
            inst = await pool.open(source)
            await pool.reset(inst, self.rng.randrange(2**31))
            if self.rng.random() < 0.5:
                actions = solution_actions(await pool.solution(inst)) or []
            else:
                actions = [f"\\boxed{{{self.rng.randrange(10**4)}}}" for _ in range(6)]
            for action in actions[:40]:
                *_, term, trunc, _ = await pool.step(inst, action)
                if term or trunc:
                    break
            self.n["episodes"] += 1
        except EnvError as exc:
            self.n["lost"] += 1
            self.errors.append(f"lost episode: {exc}"[:300])
        finally:
            if inst is not None:
                await pool.close(inst)

    async def crash(self, pool: EnvPool) -> None:
        inst = None
        try:
            self.crashes += 1  # a source of its own: the crash takes only its own worker
            inst = await pool.open(f"# crash {self.crashes}\n{CRASHY}")
            await pool.reset(inst, self.rng.randrange(2**31))
            for _ in range(6):
                await pool.step(inst, "go")
            self.n["misjudged"] += 1  # it should have crashed
            self.errors.append("crashy environment did not crash")
        except EnvError as exc:
            if exc.kind not in ("crash", "timeout", "exception"):
                self.n["misjudged"] += 1
                self.errors.append(f"crash classified as {exc.kind}: {exc.message}"[:300])
            self.n["crash_episodes"] += 1
        finally:
            if inst is not None:
                await pool.close(inst)
                if not inst.worker.dead:  # a raise leaves the worker: this one is done
                    await pool.release(inst.env_id)

    async def check(self, pool: EnvPool) -> None:
        if self.rng.random() < 0.7:
            name = self.rng.choice(REJECTED)
            source, want = self.rejected[name], False
        else:
            name, source, want = "valid", self.valid_source(), True
        verdict = await validate_source(source, pool=pool, seeds=(0, 1))
        self.n["checks"] += 1
        if verdict.valid is not want:
            self.n["misjudged"] += 1
            self.errors.append(f"{name}: {verdict.stage} {verdict.reason}"[:300])

    async def worker(self, pool: EnvPool, deadline: float) -> None:
        while time.monotonic() < deadline:
            pick = self.rng.random()
            if pick < 0.6:
                await self.episode(pool)
            elif pick < 0.75:
                await self.crash(pool)
            else:
                await self.check(pool)

    def sample(self, pool: EnvPool, t: float, last: dict) -> dict:
        stats = pool.stats()
        worker_kb = sum(_rss_kb(p) for w in stats["pids"] for p in _tree(w))
        dt = max(t - last.get("t", 0.0), 1e-9)
        row = {
            "t": round(t, 1),
            "checks_per_s": round((self.n["checks"] - last.get("checks", 0)) / dt, 3),
            "episodes_per_s": round(
                (self.n["episodes"] + self.n["crash_episodes"] - last.get("episodes", 0)) / dt, 3
            ),
            "spawned": pool.counters["spawned"],
            "died": pool.counters["died"],
            "killed": pool.counters["killed"],
            "parent_rss_kb": _rss_kb("self"),
            "workers": stats["workers"],
            "workers_rss_kb": worker_kb,
            "open_fds": len(os.listdir("/proc/self/fd")),
            **_shm(),
            **_temp(),
        }
        last.update(
            t=t, checks=self.n["checks"], episodes=self.n["episodes"] + self.n["crash_episodes"]
        )
        return row

    async def run(self) -> tuple[list[dict], dict, str, str]:
        rows, last = [], {}
        start_shm = _shm()
        t0 = time.monotonic()
        deadline = t0 + self.seconds
        async with EnvPool(POOL) as pool:
            tag = f"spade-worker-{os.getpid()}-"
            isolation = pool.isolation
            task_limit = pool.stats()["task_limit"]

            async def sampler() -> None:
                base = None  # --tracemalloc: the allocations at the second sample
                while True:
                    await anyio.sleep(self.interval)
                    rows.append(self.sample(pool, time.monotonic() - t0, last))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    if self.trace and len(rows) >= 2:
                        snap = tracemalloc.take_snapshot()
                        if base is None:
                            base = snap
                            continue
                        for d in snap.compare_to(base, "lineno")[:8]:
                            print(f"  tracemalloc since sample 2: {d}", file=sys.stderr)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sampler)
                async with anyio.create_task_group() as workers:
                    for _ in range(self.concurrency):
                        workers.start_soon(self.worker, pool, deadline)
                tg.cancel_scope.cancel()
            rows.append(self.sample(pool, time.monotonic() - t0, last))
        left_deadline = time.monotonic() + 10
        while (left := sandbox.find_pids(tag)) and time.monotonic() < left_deadline:
            await anyio.sleep(0.1)
        made = tasks.cgroups()
        while made is not None and made.leftover() and time.monotonic() < left_deadline + 5:
            made.sweep()  # a leaf whose last task was still exiting when its worker was killed
            await anyio.sleep(0.1)
        end = {
            "processes_left": len(left),
            "cgroups_left": len(made.leftover()) if made is not None else 0,
            "shm_start": start_shm,
            "shm_end": _shm(),
            "temp_end": _temp(),
        }
        return rows, end, isolation, task_limit


def growth(rows: list[dict], key: str, seconds: float) -> float:
    """Relative growth of ``key`` from the start of minute 2 (the first sample at or after
    60 s; half the run for a shorter one: warm-up is over) to the end."""
    start = min(60.0, seconds / 2)
    base = next((r[key] for r in rows if r["t"] >= start), rows[0][key])
    return round((rows[-1][key] - base) / max(base, 1), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 minutes")
    ap.add_argument("--minutes", type=float, default=None, help="how long (default 20)")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--concurrency", type=int, default=8, help="tasks at once")
    ap.add_argument("--save", action="store_true", help="write bench/results/soak*.json")
    ap.add_argument(
        "--tracemalloc", action="store_true",
        help="diagnose parent RSS growth: print the top allocation growth since sample 2",
    )  # fmt: skip
    args = ap.parse_args()
    minutes = args.minutes if args.minutes is not None else (2.0 if args.quick else 20.0)
    if minutes <= 0 or args.interval <= 0 or args.concurrency < 1:
        refuse("--minutes and --interval must be positive, --concurrency at least 1")
    if minutes * 60 < 2 * args.interval:
        refuse(f"--minutes {minutes:g} holds fewer than two --interval {args.interval:g} s")
    soak = Soak(minutes * 60, args.interval, args.concurrency, args.tracemalloc)
    rows, end, isolation, task_limit = anyio.run(soak.run)
    rss = growth(rows, "parent_rss_kb", minutes * 60)
    fds = growth(rows, "open_fds", minutes * 60)
    shm_back = end["shm_end"]["dev_shm_bytes"] <= end["shm_start"]["dev_shm_bytes"] + 65536
    targets = {
        "lost_episodes": {"target": "== 0", "measured": soak.n["lost"], "met": soak.n["lost"] == 0},
        "misjudged": {
            "target": "== 0", "measured": soak.n["misjudged"], "met": soak.n["misjudged"] == 0,
        },
        "processes_left": {
            "target": "== 0 (and no worker cgroup left)",
            "measured": end["processes_left"] + end["cgroups_left"],
            "met": end["processes_left"] + end["cgroups_left"] == 0,
        },
        "parent_rss_growth": {"target": "<= 0.05 (minute 2 to end)", "measured": rss, "met": rss <= 0.05},
        "open_fds_growth": {"target": "<= 0.05 (minute 2 to end)", "measured": fds, "met": fds <= 0.05},
        "dev_shm_back_to_start": {
            "target": "end <= start + 64 KiB",
            "measured": end["shm_end"]["dev_shm_bytes"] - end["shm_start"]["dev_shm_bytes"],
            "met": shm_back,
        },
    }  # fmt: skip
    out = {
        "hardware": {**machine(), "isolation": isolation, "task_limit": task_limit},
        "workload": {
            "minutes": minutes,
            "interval_s": args.interval,
            "concurrency": args.concurrency,
            "valid": VALID,
            "rejected": REJECTED,
            "quick": args.quick,
            "pool": {"max_workers": POOL.max_workers, "prewarm": POOL.prewarm},
        },  # fmt: skip
        "targets": targets,
        "totals": soak.n,
        "per_interval": rows,
        "end": end,
        "errors": soak.errors[:20],
        "met": all(t["met"] for t in targets.values()),
    }
    emit(out, "soak_quick" if args.quick else "soak", args.save)


if __name__ == "__main__":
    main()
