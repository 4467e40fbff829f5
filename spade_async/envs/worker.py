"""The sandboxed worker: runs ONE environment's code, serving instances of it over pipes.

Started as ``python -I worker.py RFD WFD LIMITS_JSON`` by ``sandbox.py``. Inside bubblewrap
this file sits at /opt/spade next to protocol.py, seccomp.py, tool_use.py and msgspec/;
``python -I`` adds neither PYTHONPATH nor the script dir, so we insert our own dir.

Order at boot: imports -> stdout/stderr into a capped sink -> the pool's trusted packages
on ``sys.path`` (if any) -> rlimits -> an empty session keyring of its own -> seccomp
filter -> ``Ready``. Only then is untrusted
code executed (on the first ``Open``). Every request gets exactly one reply; failures the
worker survives come back as ``Err(kind, message)``.
"""

from __future__ import annotations

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

import collections  # noqa: E402,F401 - pre-imported: injected into environment modules
import copy  # noqa: E402
import functools  # noqa: E402
import heapq  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import string  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
import typing  # noqa: E402

import msgspec  # noqa: E402
import protocol as P  # noqa: E402
import seccomp  # noqa: E402

try:  # the tool-use base class (another module of this project; stdlib only)
    from tool_use import ToolUseBaseEnv  # noqa: E402
except Exception:  # noqa: BLE001 - absent or broken: files that need it fail at load
    ToolUseBaseEnv = None

INJECTED = {
    "random": random, "re": re, "json": json, "math": math, "collections": collections,
    "itertools": itertools, "functools": functools, "string": string, "copy": copy,
    "heapq": heapq, "typing": typing,
}  # fmt: skip
# reference-style files annotate with these names without importing them
INJECTED.update(
    {name: getattr(typing, name) for name in ("Any", "Optional", "Dict", "List", "Tuple")}
)
if ToolUseBaseEnv is not None:
    INJECTED["ToolUseBaseEnv"] = ToolUseBaseEnv
    # the documented import path, ``from spade_async.envs.tool_use import ToolUseBaseEnv``,
    # maps to the same class: the project itself is not inside the sandbox
    import tool_use as _tool_use  # noqa: E402

    for _name in ("spade_async", "spade_async.envs"):
        sys.modules[_name] = types.ModuleType(_name)
        sys.modules[_name].__path__ = []
    sys.modules["spade_async.envs.tool_use"] = _tool_use
    sys.modules["spade_async"].envs = sys.modules["spade_async.envs"]
    sys.modules["spade_async.envs"].tool_use = _tool_use


SOURCE_NAME = "<environment>"
SITE = "/opt/spade/site-packages"  # packages.SITE: the pool's trusted packages under bubblewrap


class CappedSink:
    """Replacement for sys.stdout/sys.stderr: keeps only the last ``cap`` characters."""

    def __init__(self, cap: int) -> None:
        self.cap, self.text = cap, ""

    def write(self, s: object) -> int:
        s = str(s)
        self.text = (self.text + s[-self.cap :])[-self.cap :]
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class Fail(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Worker:
    def __init__(self, rfd: int, wfd: int, limits: dict) -> None:
        self.rfd, self.wfd, self.limits = rfd, wfd, limits
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(P.Request)
        self.env_id: str | None = None
        self.env_cls: type | None = None
        self.env_name = ""
        self.instances: dict[int, object] = {}
        self.buf = bytearray()

    # --- framing ---------------------------------------------------------------------
    def read_frame(self) -> tuple[int, bytes] | None:
        h = P.HEADER.size
        while True:
            if len(self.buf) >= h:
                n, seq = P.HEADER.unpack_from(self.buf)
                if len(self.buf) >= h + n:
                    data = bytes(self.buf[h : h + n])
                    del self.buf[: h + n]
                    return seq, data
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                return None
            self.buf += chunk

    def send(self, msg: object, seq: int) -> None:
        data = memoryview(P.frame(self.encoder.encode(msg), seq))
        while data:
            data = data[os.write(self.wfd, data) :]

    # --- checks ----------------------------------------------------------------------
    def obs(self, value: object, where: str) -> str:
        if type(value) is not str:  # exact: a subclass can lie about its length
            raise Fail("contract", f"{where} observation is {type(value).__name__}, expected str")
        if len(value) > self.limits["max_obs_chars"]:
            raise Fail(
                "output_too_large",
                f"{where} observation has {len(value):,} chars (cap {self.limits['max_obs_chars']:,})",
            )
        return value

    def builtins(self, value: object, where: str, cap: int) -> object:
        value = msgspec.to_builtins(value, str_keys=True, enc_hook=repr)
        size = len(self.encoder.encode(value))
        if size > cap:
            raise Fail("output_too_large", f"{where} is {size:,} bytes encoded (cap {cap:,})")
        return value

    def info(self, value: object, where: str) -> dict:
        if not isinstance(value, dict):
            raise Fail("contract", f"{where} info is {type(value).__name__}, expected dict")
        return self.builtins(value, f"{where} info", self.limits["max_info_bytes"])

    # --- handlers --------------------------------------------------------------------
    def load(self, env_id: str, source: str, wanted: str = "") -> None:
        module = types.ModuleType("env_module")
        module.__dict__.update(INJECTED)
        sys.modules["env_module"] = module
        source = source.removeprefix("\ufeff")  # a byte-order mark, as Python's reader drops it
        linecache.cache[SOURCE_NAME] = (len(source), None, source.splitlines(True), SOURCE_NAME)
        exec(compile(source, SOURCE_NAME, "exec"), module.__dict__)  # noqa: S102
        if wanted:  # the class the static stage found, by its module-level name
            cls = module.__dict__.get(wanted)
            if not isinstance(cls, type) or not all(
                callable(getattr(cls, m, None)) for m in ("reset", "step")
            ):
                raise Fail("structure", f"after loading, {wanted} is not a class with reset/step")
            self.env_id, self.env_cls, self.env_name = env_id, cls, wanted
            return
        cands = [
            (k, v)
            for k, v in module.__dict__.items()
            if isinstance(v, type) and k.endswith("Env") and v.__module__ == "env_module"
            and callable(getattr(v, "reset", None)) and callable(getattr(v, "step", None))
        ]  # fmt: skip
        cands = [
            (k, c) for k, c in cands if not any(o is not c and issubclass(o, c) for _, o in cands)
        ]
        if len(cands) != 1:
            names = ", ".join(k for k, _ in cands) or "none"
            raise Fail(
                "structure",
                f"expected exactly one class named ...Env with reset() and step(), found {names}",
            )
        self.env_id, (self.env_name, self.env_cls) = env_id, cands[0]

    def handle(self, msg: object) -> object:
        if isinstance(msg, P.Open):
            if self.env_cls is None:
                self.load(msg.env_id, msg.source, msg.env_class)
            elif msg.env_id != self.env_id:
                raise Fail("contract", f"worker holds env {self.env_id}, not {msg.env_id}")
            self.instances[msg.instance] = self.env_cls(**msg.kwargs)
            return P.Opened(self.env_name)
        env = self.instances.get(msg.instance)
        if env is None:
            raise Fail("lost", f"no instance {msg.instance} in this worker")
        if isinstance(msg, P.Step):
            out = env.step(msg.action)
            if not isinstance(out, tuple | list) or len(out) != 5:
                n = len(out) if isinstance(out, tuple | list) else type(out).__name__
                raise Fail("contract", f"step() returned {n}, expected a 5-tuple")
            obs, reward, term, trunc, info = out
            if type(reward) not in (int, float):  # exact: a subclass can lie to conversions
                raise Fail("contract", f"step() reward is {type(reward).__name__}, expected float")
            reward = float(reward)  # converted ONCE: the value checked is the value sent
            if not -10.0 <= reward <= 10.0:  # also rejects NaN (the parent checks again)
                raise Fail("contract", f"step() reward {reward!r} is outside [-10, 10]")
            if not isinstance(term, bool) or not isinstance(trunc, bool):
                kinds = f"{type(term).__name__}, {type(trunc).__name__}"
                raise Fail("contract", f"step() terminated/truncated are {kinds}, expected bool")
            return P.StepOk(self.obs(obs, "step()"), reward, term, trunc,
                            self.info(info, "step()"))  # fmt: skip
        if isinstance(msg, P.Reset):
            out = env.reset(seed=msg.seed)
            if not isinstance(out, tuple | list) or len(out) != 2:
                n = len(out) if isinstance(out, tuple | list) else type(out).__name__
                raise Fail("contract", f"reset() returned {n}, expected (obs, info)")
            return P.ResetOk(self.obs(out[0], "reset()"), self.info(out[1], "reset()"))
        if isinstance(msg, P.Solution):
            value = env.solution()
            ok = isinstance(value, str) or (
                isinstance(value, list | tuple) and all(isinstance(a, str) for a in value)
            )
            if not ok:
                raise Fail(
                    "contract",
                    f"solution() returned {type(value).__name__}, expected str or list[str]",
                )
            return P.Value(self.builtins(value, "solution()", self.limits["max_obs_chars"]))
        if isinstance(msg, P.GetTools):
            tools = env.get_tools() if callable(getattr(env, "get_tools", None)) else []
            return P.Value(self.builtins(tools, "get_tools()", self.limits["max_info_bytes"]))
        if isinstance(msg, P.Close):
            self.instances.pop(msg.instance, None)
            if callable(getattr(env, "close", None)):
                env.close()
            return P.Closed()
        raise Fail("contract", f"unknown request {type(msg).__name__}")

    def serve(self) -> None:
        while (got := self.read_frame()) is not None:
            seq, data = got
            try:
                reply = self.handle(self.decoder.decode(data))
            except Fail as exc:
                reply = P.Err(exc.kind, str(exc))
            except MemoryError:
                reply = P.Err(
                    "memory", f"MemoryError (address-space cap {self.limits['memory_mb']} MB)"
                )
            except SystemExit as exc:
                reply = P.Err("crash", f"environment called sys.exit({exc.code!r})")
            except BaseException as exc:  # noqa: BLE001 - environment failures are data
                text = describe(exc)
                if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
                    text = f"{text} [task limit: {self.limits['nproc']} tasks per worker" + (
                        "; no threads: root without a pids cgroup]"
                        if not self.limits.get("threads", True) else "]"
                    )  # fmt: skip
                reply = P.Err("exception", text)
            try:
                self.send(reply, seq)
            except MemoryError:
                self.send(P.Err("memory", "MemoryError while encoding the reply"), seq)
            except (TypeError, ValueError, OverflowError, RecursionError) as exc:
                self.send(P.Err("contract", f"reply not encodable: {exc}"), seq)


def describe(exc: BaseException) -> str:
    """``ValueError: msg (line 12 in step: x = int(a))``, environment frames only."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SOURCE_NAME]
    where = "; ".join(f"line {f.lineno} in {f.name}: {f.line}" for f in frames[-3:])
    text = f"{type(exc).__name__}: {exc}"[:2000]
    return f"{text} ({where})" if where else text


def apply_limits(limits: dict) -> None:
    mb = 1 << 20
    for name, value in (
        ("RLIMIT_AS", limits["memory_mb"] * mb),
        ("RLIMIT_CPU", limits["cpu_seconds"]),
        ("RLIMIT_FSIZE", limits["file_mb"] * mb),
        ("RLIMIT_NOFILE", limits["open_files"]),
        ("RLIMIT_NPROC", limits["nproc"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def stay_off_pid_1() -> None:
    """As PID 1 of a pid namespace (``unshare --pid --fork``) the kernel ignores signals we
    send ourselves, so an environment's self-SIGKILL would be a no-op. Fork once (before the
    seccomp filter forbids it): the parent waits as the namespace's init and exits with the
    child's status (a signal N becomes 128+N, as bubblewrap reports it)."""
    if os.getpid() != 1:
        return
    child = os.fork()
    if child == 0:
        return
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            os._exit(
                128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            )


def main(argv: list[str]) -> None:
    rfd, wfd, limits = int(argv[1]), int(argv[2]), json.loads(argv[3])
    seccomp.die_with_parent()  # our parent: the pool (rlimit), unshare, or bwrap's init
    stay_off_pid_1()
    sys.stdout = sys.stderr = CappedSink(limits["sink_chars"])
    os.dup2(1, 2)  # fd 2 off the parent's boot-error pipe, onto stdout's /dev/null
    workdir = limits.get("workdir")
    if limits.get("private_tmpfs"):  # unshare level: our own mount namespace
        # the usual RAM-backed places become capped tmpfs, the root and /dev read-only;
        # other mounts of the host stay as they are (this level hides no files)
        for target in ("/", "/dev"):
            seccomp.remount_ro(target)
        for target, mb in (("/tmp", limits["tmp_mb"]), ("/dev/shm", limits["shm_mb"]),
                           ("/run", 1), ("/var/tmp", 1)):  # fmt: skip
            if os.path.isdir(target) and seccomp.mount_tmpfs(target, mb << 20) and target == "/tmp":
                workdir = "/tmp"  # private: the same path in every worker, as under bwrap
        os.makedirs(workdir, exist_ok=True)
    if workdir:
        os.chdir(workdir)
    os.environ.clear()
    os.environ["TMPDIR"] = workdir or "/tmp"
    if limits.get("packages"):  # trusted libraries, bound read-only at SITE (packages.py)
        sys.path.append(SITE)
        # one BLAS/OpenMP thread: a pool of threads per worker multiplies its address space
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        os.environ.update(MPLBACKEND="Agg", MPLCONFIGDIR=os.environ["TMPDIR"])
    apply_limits(limits)
    seccomp.join_empty_keyring()  # nothing of the host's session keyring (then keyctl is denied)
    threads = limits.get("threads", True)  # False: root without a pids cgroup (tasks.py)
    filtered = seccomp.install(os.getpid(), threads) if limits["deny_fork"] else False
    worker = Worker(rfd, wfd, limits)
    worker.send(P.Ready(os.getpid(), filtered), 0)
    worker.serve()


if __name__ == "__main__":
    main(sys.argv)
