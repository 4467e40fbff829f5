"""What two runs of one seed are compared on (docs/determinism.md): step records without
their time fields, memory records without their times, and the final weights' checksums."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec
import torch

from spade_async.memory.store import MemoryStore
from spade_async.rundir import RunDir

TIME_KEYS = ("time",)
TIME_PREFIXES = ("time/", "busy_s/", "idle_s/", "tokens_per_s/")
TIME_SUFFIXES = ("_s", "seconds", "tokens_per_s")


def timeless(record: dict) -> dict:
    """A step record without its wall-clock fields (times, busy/idle, throughput)."""
    return {
        k: v
        for k, v in record.items()
        if k not in TIME_KEYS and not k.startswith(TIME_PREFIXES) and not k.endswith(TIME_SUFFIXES)
    }


def step_bytes(run_dir: RunDir) -> bytes:
    """Every step record of the run, time fields removed, as the bytes compared."""
    lines = run_dir.metrics.read_text().splitlines()
    steps = [timeless(r) for r in map(json.loads, lines) if r["kind"] == "step"]
    return "\n".join(json.dumps(r, sort_keys=True) for r in steps).encode()


def memory_bytes(run_dir: RunDir, cfg) -> bytes:
    """Every memory record in id order, creation and update times removed."""
    with MemoryStore(run_dir.memory, cfg.memory) as store:
        recs = sorted(store.records(), key=lambda r: r.id)
        out = [msgspec.structs.replace(r, created_at=0.0, updated_at=0.0) for r in recs]
    return msgspec.json.encode(out)


def weight_sums(folder: Path) -> dict[str, str]:
    """SHA-256 of every tensor of a model folder (a run's final export: ``run_dir.hf``)."""
    from safetensors.torch import load_file

    sums: dict[str, str] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            for key, t in sorted(load_file(folder / name).items()):
                raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                sums[key] = hashlib.sha256(raw).hexdigest()
    return sums


def load_factor() -> float:
    """How much slower than an idle machine this one may be now: the 1-minute load average
    per core (``os.getloadavg``), at least 1, at most 10."""
    load = os.getloadavg()[0]
    return min(10.0, max(1.0, load / (os.cpu_count() or 1)))


def load_scaled(seconds: float) -> int:
    """A test's timeout: ``seconds`` on an idle machine, stretched by ``load_factor``."""
    return int(seconds * load_factor())


def patient(factor: float | None = None) -> list[str]:
    """Overrides that stretch every wall-clock limit inside a run by the load factor: an
    environment call or a generation that only ran slow must never count as a timeout
    (that would change what the run records, not just how long it takes)."""
    f = load_factor() if factor is None else factor
    return [
        f"envs.call_timeout_s={5.0 * f}",
        f"envs.open_timeout_s={10.0 * f}",
        f"envs.boot_timeout_s={20.0 * f}",
        f"client.health_timeout_s={5.0 * f}",
        f"client.connect_timeout_s={5.0 * f}",
        f"engine.start_timeout_s={600.0 * f}",
    ]
