"""What every bench result says about the machine it ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """CPU, cores, load and Python: the fields every bench's ``hardware`` starts with."""
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
