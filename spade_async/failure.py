"""Why a child process died, in one line: its own exception record, or its log's last error.

Every child the controller starts (trainer ranks, engines, the router, the watchdog, sandbox
workers) can die before it answers. The parent's message then has to carry the cause, not
"exited with status 1" or torch elastic's "To enable traceback" banner:

- a child of ours wraps its entry point in ``run_recorded``: an uncaught exception is written
  as a small JSON record (type, message, the last frames) into the directory named by
  ``$SPADE_ERROR_DIR``, and printed as one line to stderr, before it propagates;
- the parent reads the earliest record (``recorded_cause``: the first rank to die is the
  cause, the others die of its absence), or for a child it does not own (SGLang) the last
  line of its log that names an exception (``log_cause``).

Standard library only: the trainer ranks import it and never import anyio.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ENV = "SPADE_ERROR_DIR"
MAX_MESSAGE = 400
# a line that names an exception: "RuntimeError: boom", "torch.OutOfMemoryError: ...",
# "ERROR: ...", "error: ...", "Fatal Python error: ..."
_ERROR_LINE = re.compile(
    r"^\s*(?:[\w.]+(?:Error|Exception|Exit|Interrupt|Died)\b|Fatal Python error|ERROR\b|error:)"
)
_NOISE = ("To enable traceback", "error_file:", "traceback :", "Root Cause", "Failures:")


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """Collapse whitespace to single spaces and cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _frames(exc: BaseException, n: int = 3) -> list[str]:
    tb = traceback.extract_tb(exc.__traceback__)[-n:]
    return [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in tb]


def record(exc: BaseException, *, who: str, directory: str | os.PathLike | None = None) -> dict:
    """Write ``exc`` as this process's failure record (when a directory is set); return it."""
    rec = {
        "who": who,
        "pid": os.getpid(),
        "time": time.time(),
        "type": type(exc).__qualname__,
        "message": one_line(str(exc)),
        "frames": _frames(exc),
    }
    directory = directory or os.environ.get(ENV)
    if directory:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f".{who}-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(rec))
        tmp.replace(path / f"{who}-{os.getpid()}.json")
    return rec


def describe(rec: dict) -> str:
    """``rank 1: RuntimeError: boom (at main.py:104 in main <- step.py:88 in __init__)``"""
    where = " <- ".join(reversed(rec.get("frames") or []))
    cause = f"{rec['type']}: {rec['message']}" if rec.get("message") else rec["type"]
    return f"{rec['who']}: {cause}" + (f" (at {where})" if where else "")


def run_recorded(main: Callable[[], int], who: str) -> int:
    """Run ``main``; an uncaught exception is recorded and printed in one line, then re-raised."""
    try:
        return main()
    except SystemExit:
        raise
    except BaseException as exc:
        rec = record(exc, who=who)
        print(f"[{who} died] {describe(rec)}", file=sys.stderr, flush=True)
        raise


def recorded_cause(directory: str | os.PathLike, since: float = 0.0) -> str | None:
    """The earliest failure record written in ``directory`` after ``since``, described."""
    recs = []
    for path in Path(directory).glob("*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("time", 0) >= since and "type" in rec:
            recs.append(rec)
    if not recs:
        return None
    first = min(recs, key=lambda r: r["time"])
    more = f" (+{len(recs) - 1} more)" if len(recs) > 1 else ""
    return describe(first) + more


def error_line(text: str, *, any_last: bool = False) -> str | None:
    """The last line of ``text`` that names an exception or an error (with ``any_last``,
    failing that, the last non-empty line), or None."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line) and not any(n in line for n in _NOISE):
            return one_line(line)
    return one_line(lines[-1]) if any_last and lines else None


def log_cause(log_path: str | os.PathLike, max_bytes: int = 64 << 10) -> str | None:
    """The last line of a log that names an exception or an error, or None."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return error_line(f.read().decode("utf-8", "replace"))
    except OSError:
        return None


def died(kind: str, status: int | None, log_path: str | os.PathLike, when: str = "") -> str:
    """``<kind> exited with status N during start-up: <cause>; log: <path>``"""
    cause = log_cause(log_path) or "no error line in its log"
    what = f"exited with status {status}" if status is not None else "died"
    return f"{kind} {what}{' ' + when if when else ''}: {cause}; log: {log_path}"
