"""Start, watch and stop the trainer ranks (``torchrun``) from the controller.

``TrainerProcess`` runs ``python -m torch.distributed.run --standalone --nproc-per-node N
-m spade_async.trainer.main ...`` in its own process group with output in a log file, waits
for rank 0's socket (with a timeout, failing fast if torchrun exits), and reports death:
torchrun tears every rank down when one dies, so "torchrun exited" is the dead-rank signal
the client polls through ``alive()``. ``stop()`` asks for a clean shutdown, then SIGTERM,
then SIGKILL of the whole group.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from spade_async import failure
from spade_async.trainer import exports
from spade_async.trainer.client import TrainerClient, TrainerDied
from spade_async.trainer.config import TrainerConfig

__all__ = ["TrainerProcess"]


class TrainerProcess:
    def __init__(
        self,
        cfg: TrainerConfig,
        model_dir: str | Path,
        run_dir: str | Path,
        *,
        nproc: int = 1,
        load: str | Path | None = None,
        threads: int = 0,
        env: dict[str, str] | None = None,
        rdzv: list[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)  # created by start(): building the command has no side effects
        self.env = dict(env or {})  # e.g. CUDA_VISIBLE_DEVICES from the placement (placement.py)
        self.socket_path = cfg.socket_path or str(self.run_dir / "trainer.sock")
        if len(self.socket_path.encode()) > 100:  # AF_UNIX paths stop at 107 bytes
            digest = hashlib.sha1(self.socket_path.encode()).hexdigest()[:12]
            self.socket_path = str(Path(tempfile.gettempdir()) / f"spade-trainer-{digest}.sock")
        self.log_path = self.run_dir / "trainer.log"
        self.error_dir = self.run_dir / "trainer-errors"  # one record per dead rank (failure.py)
        self.started_at = 0.0
        self.cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *(rdzv or ["--standalone"]),  # several nodes: launch/nodes.py torchrun_rdzv
            f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2",
            "-m",
            "spade_async.trainer.main",
            "--model-dir",
            str(model_dir),
            "--config-json",
            msgspec.json.encode(cfg).decode(),
            "--socket",
            self.socket_path,
        ]
        if load:
            self.cmd += ["--load", str(load)]
        if threads:
            self.cmd += ["--threads", str(threads)]
        self.proc: subprocess.Popen | None = None
        self.client: TrainerClient | None = None

    def start(self) -> TrainerClient:
        """Launch and return a connected client once rank 0 answers a ping."""
        exports.sweep()  # weight exports of trainers that died earlier (crash, kill -9)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
            failure.ENV: str(self.error_dir),
            **self.env,
        }
        self.started_at = time.time()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while not os.path.exists(self.socket_path):
            dead = self.alive()
            if dead:
                raise TrainerDied(f"trainer failed to start: {dead}")
            if time.monotonic() > deadline:
                self.kill()
                raise TrainerDied(
                    f"trainer did not open {self.socket_path} within {self.cfg.start_timeout_s:.0f}"
                    f" s; see {self.log_path}"
                )
            time.sleep(0.1)
        self.client = TrainerClient(self.socket_path, alive=self.alive)
        self.client.ping(timeout=max(1.0, deadline - time.monotonic()))
        return self.client

    def log_tail(self, n: int = 12) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-n:] if line.strip())

    def alive(self) -> str | None:
        """None while torchrun runs; otherwise why it is gone (exit status and log tail)."""
        if self.proc is None:
            return "trainer was never started"
        code = self.proc.poll()
        if code is None:
            return None
        cause = failure.recorded_cause(self.error_dir, since=self.started_at)
        if cause is None or cause.startswith("unreadable record"):  # killed, died before
            said = failure.log_cause(self.log_path)  # Python ran, or a record we cannot read
            cause = "; ".join(c for c in (cause, said) if c) or "no exception recorded"
        return f"trainer ranks exited with status {code}: {cause}; log: {self.log_path}"

    def stop(self, timeout: float = 30.0) -> int | None:
        """Clean shutdown if possible, then terminate the process group; returns exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and self.client is not None:
            try:
                self.client.shutdown(timeout=timeout)
            except TrainerDied:
                pass
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        exports.sweep()  # its weight export in /dev/shm goes with it
        return code

    def kill(self) -> int | None:
        if self.proc is None:
            return None
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        if self.client is not None:
            self.client.close()
        exports.sweep()  # its weight export in /dev/shm goes with it (crash or not)
        return self.proc.poll()

    def __enter__(self) -> TrainerClient:
        return self.start()

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.stop()
        else:
            self.kill()
