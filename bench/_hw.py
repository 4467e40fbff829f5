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


def refuse(message: str) -> None:
    """A workload this machine cannot run, or a bad argument: one line on stderr, exit 2."""
    import sys

    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def int_list(text: str, what: str) -> list[int]:
    """'1000,100000' -> [1000, 100000], refusing anything but positive integers."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        refuse(f"{what} must be positive integers separated by commas, got {text!r}")
    return values


def machine() -> dict:
    """CPU, cores, load and Python: the fields every bench's ``hardware`` starts with."""
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def emit(result: dict, name: str, save: bool) -> None:
    """Every bench's last words: with ``save``, ``bench/results/NAME.json`` (indented), then
    the same object as one JSON line on stdout (the figures a reader or a test parses)."""
    import json

    if save:
        path = Path(__file__).resolve().parent / "results" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
