"""GPU models the planner knows, by name, and the one on this machine (``nvidia-smi``).

Capacities are what ``nvidia-smi --query-gpu=memory.total`` reports (MiB), i.e. what CUDA
can hand out before its own context; the planner takes its reserve off that.
"""

from __future__ import annotations

import shutil
import subprocess

import msgspec

from spade_async.errors import ConfigError

__all__ = ["Gpu", "GPUS", "gpu_by_name", "detect_gpu"]

MIB = 1 << 20


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # e.g. "h100-80gb"
    memory_bytes: int  # memory.total as nvidia-smi reports it
    source: str = "named"  # "named" (--gpu), "nvidia-smi", or "default"


def _gpu(name: str, mib: int) -> Gpu:
    return Gpu(name=name, memory_bytes=mib * MIB)


# memory.total (MiB) of each model as nvidia-smi prints it
GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        _gpu("a100-40gb", 40960),
        _gpu("a100-80gb", 81920),
        _gpu("l40s-48gb", 46068),
        _gpu("h100-80gb", 81559),
        _gpu("h100-94gb", 95830),  # H100 NVL
        _gpu("h20-96gb", 97871),
        _gpu("h200-141gb", 143771),
        _gpu("b200-180gb", 183359),
    )
}


def gpu_by_name(name: str) -> Gpu:
    key = name.strip().lower()
    if key in GPUS:
        return GPUS[key]
    raise ConfigError(
        f"--gpu {name!r} is not a GPU model the planner knows: use one of {', '.join(GPUS)}"
    )


def _match(product: str, mib: int) -> str:
    """A planner name for nvidia-smi's product name + memory (e.g. 'NVIDIA H100 80GB HBM3')."""
    p = product.lower()
    for family in ("h200", "h100", "h20", "b200", "a100", "l40s"):
        if family in p.replace(" ", "").replace("-", ""):
            return f"{family}-{round(mib / 1024)}gb"
    return f"{product.strip().replace(' ', '-').lower()}-{round(mib / 1024)}gb"


def detect_gpu() -> Gpu | None:
    """The first GPU nvidia-smi lists here (no CUDA context), or None on a CPU-only machine."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            mib = int(parts[1])
            return Gpu(name=_match(parts[0], mib), memory_bytes=mib * MIB, source="nvidia-smi")
    return None
