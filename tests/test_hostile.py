"""The hostile corpus (tests/hostile/*.py) through the real validation gates, in ONE pool.

Each program attacks the host or the protocol in one way. For each we assert the stage the
validator classifies it as AND that the host is unharmed: no loopback connection arrived,
no file escaped the sandbox, no secret (a file or an environment variable) came back, the
pool still validates a good environment afterwards, and after the pool closes no process
that ran hostile code is left (each hostile program renames itself through /proc/self/comm
to a tag unique to this run, which its children would inherit, and the shell that
exec_shell.py becomes carries the tag in its command line).

The programs are deliberately not named test_*.py, so pytest never imports them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from spade_async.envs.cli import _human
from spade_async.envs.examples import HERE as EXAMPLES
from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.validate import ValidateConfig, Verdict, validate_source

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "hostile"
TOKEN = uuid.uuid4().hex[:12]
COMM = f"spdh{TOKEN[:10]}"  # per run (comm holds 15 chars), so parallel runs do not mix
SECRET = f"spade-hostile-secret-{TOKEN}"
KEYDESC = f"spade-hostile-key-{TOKEN}"  # a key with SECRET in this process's session keyring

# program -> the stage the validator must report
CASES = {
    "loop_at_import.py": "timeout",
    "loop_in_init.py": "timeout",
    "loop_in_reset.py": "timeout",
    "loop_in_step.py": "timeout",
    "sleep_past_timeout.py": "timeout",
    "solution_hangs.py": "timeout",
    "exec_shell.py": "timeout",  # the shell never answers; its process group is killed
    "ignore_sigterm.py": "timeout",
    "memory_bomb.py": "memory",
    "memory_at_import.py": "memory",
    "fd_exhaustion.py": "reset",  # RLIMIT_NOFILE
    "disk_fill.py": "reset",  # RLIMIT_FSIZE (and the size-capped tmpfs)
    "fork_bomb.py": "reset",  # fork() is refused (EPERM) -> an exception in reset()
    "daemonize.py": "reset",  # same: the daemon is never born
    "c_stack_overflow.py": "crash",
    "ctypes_segfault.py": "crash",
    "os_exit.py": "crash",
    "sys_exit.py": "crash",
    "sigkill_self.py": "crash",
    "sigsegv_self.py": "crash",
    "kill_parent.py": "reset",  # kill(ppid) is refused (EPERM)
    "loopback_connect.py": "reset",  # no network: the connection fails
    "write_outside_tmp.py": "ok",  # writes fail or land in the private tmpfs; see test below
    "read_secret_file.py": "ok",  # reads fail; see test below
    "leak_environment.py": "ok",  # the environment is scrubbed; see test below
    "huge_observation.py": "output_too_large",
    "huge_info.py": "output_too_large",
    "huge_solution.py": "output_too_large",
    "stdout_flood.py": "feasibility",  # forged "ok" lines and frames do not fool the parent
    "stderr_flood.py": "feasibility",
    "wrong_type_reset.py": "reset",
    "empty_observation.py": "reset",
    "wrong_type_step.py": "step",
    "nan_reward.py": "step",
    "huge_reward.py": "step",
    "wrong_arity.py": "step",
    "nondeterministic_reset.py": "determinism",
    "trivially_won.py": "not_done_at_reset",
    "bad_solution.py": "feasibility",
    "init_raises.py": "load",
    "two_env_classes.py": "structure",
    "no_env_class.py": "structure",
    "syntax_error.py": "syntax",
    # issue 16: the parent decides, gates that cannot be gamed, nothing parked outside limits
    "forged_reply_frames.py": "protocol",  # a second, correctly numbered reply frame
    "patched_handler.py": "step",  # the worker's checks bypassed: the parent refuses -1e6
    "float_subclass_reward.py": "step",  # no subclass survives: the value checked is sent
    "solution_side_effect.py": "feasibility",  # replayed where solution() never ran
    "salted_at_import.py": "determinism",  # same seed, two worker processes, two games
    "forged_names.py": "step",  # the class name is the static one; no forged line
    "shm_hoarder.py": "reset",  # every way to park RAM refused or capped
    # issue 22: kernel state shared with the host, task floods, validation a game can detect
    "keyring_thief.py": "ok",  # keyctl refused, an empty keyring of its own; see test below
    "thread_flood.py": "reset",  # a task limit that binds for root (pids cgroup / no threads)
    "garbage_wins_later.py": "not_done_at_reset",  # garbage is played for several turns
    "probe_aware.py": "not_done_at_reset",  # the garbage is drawn at random per check
    "tool_any_answer.py": "not_done_at_reset",  # wrong non-empty answers are tried
    "validation_aware.py": "ok",  # same Open shape in training; see test below
    "second_instance_differs.py": "determinism",  # a second instance in the same worker
    "kernel_surface.py": "reset",  # io_uring, userfaultfd refused; PID 1 names no host path
    # issue 22, later: seeds a checker would use, nonsense that wins only after many turns
    "seed_aware.py": "not_done_at_reset",  # seeds drawn at random per check, as training's
    "garbage_wins_late.py": "not_done_at_reset",  # one garbage play per seed runs 30 turns
    "kernel_surface_more.py": "reset",  # perf, bpf, file handles, vm_readv, kcmp: refused
}
# why, for the cases where the reason is not in the name (signal names, errno text)
REASONS = {
    "fork_bomb.py": "Operation not permitted",
    "daemonize.py": "Operation not permitted",
    "kill_parent.py": "Operation not permitted",
    "c_stack_overflow.py": "SIGSEGV",
    "ctypes_segfault.py": "SIGSEGV",
    "sigsegv_self.py": "SIGSEGV",
    "sigkill_self.py": "SIGKILL",
    "memory_bomb.py": "MemoryError",
    "loopback_connect.py": "Error",  # ConnectionRefusedError / OSError: network unreachable
    "forged_reply_frames.py": "reply frame",
    "patched_handler.py": "refused by the parent",
    "float_subclass_reward.py": "reward is Sly",
    "solution_side_effect.py": "in a fresh worker",
    "salted_at_import.py": "two worker processes",
    "forged_names.py": "bad action",
    "shm_hoarder.py": "hoarding refused",
    "thread_flood.py": "task limit: 64 tasks per worker",
    "garbage_wins_later.py": "at turn 3",
    "probe_aware.py": "garbage wins",
    "tool_any_answer.py": "<answer>",
    "second_instance_differs.py": "two instances in one worker",
    "kernel_surface.py": "surface refused",
    "seed_aware.py": "garbage wins",
    "garbage_wins_late.py": "at turn 11",
    "kernel_surface_more.py": "surface refused",
}
LEAKY = ("read_secret_file.py", "leak_environment.py", "keyring_thief.py")
# classifications that only hold where the sandbox isolates that resource
NEEDS = {
    "loopback_connect.py": ("bwrap", "unshare"),
    "shm_hoarder.py": ("bwrap", "unshare"),
    # at rlimit its own environment holds its private working dir, which differs per worker
    # process: a real cross-process difference, so determinism rejects it there
    "leak_environment.py": ("bwrap", "unshare"),
    "kernel_surface.py": ("bwrap",),  # elsewhere PID 1 is the host's (or the worker's) own
}
# not even run where the sandbox does not contain it (it would park RAM on the host)
RUN_ONLY = {"shm_hoarder.py": ("bwrap", "unshare")}
HOARD_MB = 96  # what shm_hoarder.py tries to park per way (its WANT)
POOL = PoolConfig(max_workers=6, prewarm=2, call_timeout_s=6.0, open_timeout_s=6.0, memory_mb=512)


@dataclass
class Traps:
    """Host-side bait and tripwires, filled into the programs' placeholders."""

    tmp: Path
    listener: socket.socket = field(init=False)
    secret_files: list[Path] = field(init=False)
    escape_targets: list[Path] = field(init=False)
    decoy: subprocess.Popen = field(init=False)

    def __post_init__(self) -> None:
        self.key = _keyctl_add(KEYDESC, SECRET)  # the checker's session keyring holds a secret
        # a host process holding the secret in its environment (/proc/PID/environ shows the
        # environment a process started with, so setting os.environ here would prove nothing)
        self.decoy = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            env={"SPADE_HOSTILE_SECRET": SECRET},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        name = f".spade_hostile_{TOKEN}"
        self.secret_files = [self.tmp / "secret.txt", Path.home() / name, ROOT / name]
        for path in self.secret_files:
            path.write_text(SECRET)
        self.escape_targets = [
            self.tmp / "escaped.txt",
            Path.home() / f"{name}_escaped",
            ROOT / f"{name}_escaped",
            Path("/tmp") / f"{name}_escaped",
        ]

    def render(self, name: str) -> str:
        source = (CORPUS / name).read_text()
        port = self.listener.getsockname()[1]
        reads = [str(p) for p in self.secret_files] + [f"~/{self.secret_files[1].name}"]
        reads += [f"./{self.secret_files[2].name}", f"../{self.secret_files[2].name}"]
        source = source.replace("spdhostile", COMM).replace("__PORT__", str(port))
        source = source.replace("__PATHS__", json.dumps(reads)).replace("__KEYDESC__", KEYDESC)
        return source.replace("__TARGETS__", json.dumps([str(p) for p in self.escape_targets]))

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def cleanup(self) -> None:
        for desc in (KEYDESC, f"{KEYDESC}-planted"):
            key = _keyctl_search(desc)
            if key > 0:
                _libc().syscall(250, 3, key, 0, 0)  # KEYCTL_REVOKE
        self.decoy.kill()
        self.decoy.wait()
        for path in map(Path, host_shm()[1]):  # only where a weak sandbox let one write
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self.listener.close()
        for path in self.secret_files + self.escape_targets:
            path.unlink(missing_ok=True)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _keyctl_add(desc: str, payload: str) -> int:
    """add_key("user", desc, payload) into this process's session keyring (-1: no keys)."""
    data = payload.encode()
    return _libc().syscall(248, b"user", desc.encode(), data, len(data), -3)


def _keyctl_search(desc: str) -> int:
    """KEYCTL_SEARCH of this process's session keyring for a user key (-1 when absent)."""
    return _libc().syscall(250, 10, -3, b"user", desc.encode(), 0)


def host_shm() -> tuple[int, list[str], list[str]]:
    """Host shared memory: (Shmem kB from /proc/meminfo, what this run's programs left in
    RAM-backed places (files named with the run's tag), System V segments with the key that
    shm_hoarder.py asks for)."""
    kb = next(
        int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
        if ln.startswith("Shmem:")
    )  # fmt: skip
    files = [
        str(p) for d in ("/dev/shm", "/dev", "/", "/run", "/var/tmp", "/tmp")
        if Path(d).is_dir() for p in Path(d).glob(f"{COMM}*")
    ]  # fmt: skip
    key = str(zlib.crc32(COMM.encode()) & 0x7FFFFFFF)
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        rows = []
    return kb, files, [r for r in rows if r.split() and r.split()[0] == key]


@dataclass
class Outcome:
    verdicts: dict[str, Verdict]
    observations: dict[str, str]
    good_after: Verdict
    connections: int
    escaped: list[Path]
    leftover: list[str]
    tagged_while_running: list[str]
    worker_pids: list[int]
    seconds: float
    shm_before: tuple = ()
    shm_after: tuple = ()
    keys: list = field(default_factory=list)  # [planted key found on the host, our key's id]


def hostile_processes() -> list[str]:
    """'pid comm cmdline' of every live process that ran hostile code."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (ln.split()[1] for ln in (entry / "status").read_text().splitlines()
                 if ln.startswith("State:")), "?"
            )  # fmt: skip
        except OSError:
            continue
        if state != "Z" and (comm == COMM or COMM in cmdline):
            found.append(f"{entry.name} {comm} {cmdline[:80]}")
    return found


async def _run_corpus(traps: Traps) -> tuple[dict, dict, Verdict, list[int], list[str]]:
    sources = {name: traps.render(name) for name in CASES}
    verdicts: dict[str, Verdict] = {}
    limiter = anyio.CapacityLimiter(4)

    async with EnvPool(POOL) as pool:

        async def check(name: str) -> None:
            async with limiter:
                verdicts[name] = await validate_source(  # seeds drawn per check (two)
                    sources[name], pool=pool, config=ValidateConfig(random_seeds=2)
                )

        async with anyio.create_task_group() as tg:
            for name in CASES:
                if pool.isolation in RUN_ONLY.get(name, (pool.isolation,)):
                    tg.start_soon(check, name)
        observations, tagged = {}, []
        for name in LEAKY:  # what these programs actually hand back
            inst = await pool.open(sources[name])
            observations[name] = (await pool.reset(inst, 0))[0]
            tagged += hostile_processes()  # proves the leftover scan can see a live one
            await pool.close(inst)
        # validation_aware.py opened as training opens an environment (roles/agent.py: the
        # memory's 64-hex env_id, no class name): garbage must not win there either
        inst = await pool.open(
            sources["validation_aware.py"], env_id=hashlib.sha256(b"x").hexdigest()
        )
        await pool.reset(inst, 0)
        observations["validation_aware.py@training"] = await pool.step(inst, "hello?")
        await pool.close(inst)
        good = await validate_source((EXAMPLES / "mastermind.py").read_text(), pool=pool)
        pids = list(pool.stats()["pids"])
    return verdicts, observations, good, pids, tagged


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> Outcome:
    traps = Traps(tmp_path_factory.mktemp("hostile"))
    os.environ["SPADE_HOSTILE_SECRET"] = SECRET  # workers spawn after this: they must not see it
    t0 = time.perf_counter()
    shm_before = host_shm()
    try:
        verdicts, observations, good, pids, tagged = anyio.run(_run_corpus, traps)
        shm_after = host_shm()
        planted = [_keyctl_search(f"{KEYDESC}-planted"), traps.key]
        connections = traps.connections()
        escaped = [p for p in traps.escape_targets if p.exists()]
        escaped += list(Path("/tmp").glob("fill.bin")) + list(
            Path("/tmp").glob("spade-env-*/fill.bin")
        )
        deadline = time.monotonic() + 5  # let the kernel finish tearing sandboxes down
        while (leftover := hostile_processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.environ.pop("SPADE_HOSTILE_SECRET", None)
        traps.cleanup()
    return Outcome(
        verdicts, observations, good, connections, escaped, leftover, tagged, pids,
        time.perf_counter() - t0, shm_before, shm_after, planted,
    )  # fmt: skip


def _needs(outcome: Outcome, *levels: str) -> None:
    level = outcome.good_after.isolation
    if level not in levels:
        pytest.skip(f"isolation '{level}' does not isolate this by design (needs {levels})")


def test_corpus_is_complete():
    on_disk = {p.name for p in CORPUS.glob("*.py")}
    assert on_disk == set(CASES)
    assert len(CASES) >= 25
    assert not any(name.startswith("test_") for name in on_disk)


@pytest.mark.parametrize(("name", "stage"), list(CASES.items()), ids=[n[:-3] for n in CASES])
def test_hostile_program_is_classified(outcome, name, stage):
    if name in NEEDS:
        _needs(outcome, *NEEDS[name])
    verdict = outcome.verdicts[name]
    assert verdict.stage == stage, f"{name}: {verdict.stage} ({verdict.reason[:300]})"
    assert verdict.valid is (stage == "ok")
    assert REASONS.get(name, "") in verdict.reason
    assert SECRET not in repr(verdict)


def test_host_is_unharmed_and_pool_still_works(outcome):
    assert os.getppid() > 1  # kill_parent did not reach us (we are here, and so is our parent)
    assert outcome.good_after.valid and outcome.good_after.feasibility == "proven"
    assert outcome.verdicts["kill_parent.py"].isolation == outcome.good_after.isolation


def test_no_loopback_connection_arrived(outcome):
    _needs(outcome, "bwrap", "unshare")
    assert outcome.connections == 0


def test_no_file_escaped_the_sandbox(outcome):
    """write_outside_tmp.py's targets, and disk_fill.py's file (private tmpfs or workdir)."""
    _needs(outcome, "bwrap")
    assert outcome.escaped == []


@pytest.mark.parametrize("name", LEAKY)
def test_secrets_never_come_back(outcome, name):
    observation = outcome.observations[name]
    assert observation.startswith("loot=")  # the program really ran and reported its loot
    if name == "leak_environment.py":  # its own environment is scrubbed at every level
        own = json.loads(observation[len("loot=") :].split(" | ")[0])
        assert SECRET not in json.dumps(own) and "PATH" not in own, own
    _needs(outcome, "bwrap")  # elsewhere the host's files and /proc are visible by design
    assert SECRET not in observation


def test_keyring_is_the_workers_own(outcome):
    """keyring_thief.py searched the session and user keyrings for the checker's secret key
    and planted one: it got nothing, and the host's session keyring holds no planted key."""
    planted, ours = outcome.keys
    if ours < 0:
        pytest.skip("this kernel has no keys support (add_key failed)")
    loot = outcome.observations["keyring_thief.py"]
    assert SECRET not in loot and KEYDESC not in loot, loot[:400]
    assert "planted=-1" in loot and planted < 0, loot[:400]


def test_training_sees_what_validation_sees(outcome):
    """validation_aware.py plays honestly when its Open looks like validation's: opened the
    way training opens it, a nonsense reply must not win either."""
    obs, reward, terminated, _, _ = outcome.observations["validation_aware.py@training"]
    assert (reward, terminated) == (0.0, False), obs


def test_nothing_outlives_the_suite(outcome):
    assert outcome.tagged_while_running, "the /proc scan never saw a tagged hostile worker"
    assert outcome.leftover == []
    for pid in outcome.worker_pids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
        ), f"worker {pid} is still alive"


def test_corpus_runs_in_reasonable_time(outcome):
    """Not a performance assertion: a generous bound that catches a hung sandbox."""
    assert outcome.seconds < 110, outcome.seconds


def test_host_shared_memory_is_unchanged(outcome):
    """shm_hoarder.py tried to park HOARD_MB in each of nine ways: nothing of it is left
    (files, SysV segments), and host Shmem grew by less than half of one way's worth (the
    machine may be shared, so other processes may move it a little meanwhile)."""
    _needs(outcome, "bwrap", "unshare")
    (kb_before, files_before, segs_before), (kb_after, files, segs) = (
        outcome.shm_before,
        outcome.shm_after,
    )
    assert files_before == [] and files == []
    assert segs_before == [] and segs == []
    assert kb_after - kb_before < HOARD_MB * 1024 // 2, (kb_before, kb_after)  # (others may free)


def test_reported_names_are_static_and_no_output_gains_a_line(outcome):
    verdict = outcome.verdicts["forged_names.py"]
    assert verdict.env_class == "ForgedNameEnv"  # not the run-time __name__
    assert "\n" not in verdict.reason and "\\n" in verdict.reason  # escaped, still readable
    lines = _human(verdict).splitlines()
    assert sum(ln.lstrip().startswith("FAIL") for ln in lines) == 1
    assert not any(ln.startswith(("VALID", "{", "  pass  feasibility")) for ln in lines), lines
    for v in outcome.verdicts.values():  # every verdict prints as the lines it should
        assert len(_human(v).splitlines()) <= 10 + len(v.warnings), v  # 8 gates, head, replay


def test_cli_prints_no_forged_line():
    """The real command, human and JSON output, on the file as it is."""
    for extra in ([], ["--json"]):
        res = subprocess.run(
            [sys.executable, "-m", "spade_async.cli", "env", "check",
             str(CORPUS / "forged_names.py"), "--seeds", "0", *extra],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert res.returncode == 1, res.stderr
        out = res.stdout.splitlines()
        if extra:
            assert len(out) == 1 and json.loads(out[0])["env_class"] == "ForgedNameEnv"
        else:
            assert not any(ln.startswith(("VALID", "{")) for ln in out), out
            assert out[-1].startswith("REJECTED at step: class=ForgedNameEnv"), out
