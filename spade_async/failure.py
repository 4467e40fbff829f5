"""Why a child process died, in one line: its own exception record, or its log's last error.

Every child the controller starts (trainer ranks, engines, the router, the watchdog, sandbox
workers) can die before it answers. The parent's message then has to carry the cause, not
"exited with status 1" or torch elastic's "To enable traceback" banner:

- a child of ours wraps its entry point in ``run_recorded``: an uncaught exception is written
  as a small JSON record (type, message, the last frames) into the directory named by
  ``$SPADE_ERROR_DIR``, and printed as one line to stderr, before it propagates;
- the parent reads the earliest record (``recorded_cause``: the first rank to die is the
  cause, the others die of its absence), or for a child it does not own (SGLang) the last
  line of its log that names an exception (``log_cause``), however long that line is.

A record is read against one schema (``Record``, msgspec): a file that does not fit (a field
missing, null or of another type, not JSON, not an object, too large, not a plain file) is
named as ``unreadable record <path>`` in the one line, never a traceback. Every line this
module returns is cut and escaped (``safe_text.term``). No anyio: the trainer ranks import it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import msgspec

from spade_async.safe_text import term

ENV = "SPADE_ERROR_DIR"
MAX_MESSAGE = 400
MAX_RECORD = 64 << 10  # bytes: a record is a few hundred; a larger file is not one of ours
HEAD_CHARS = 4096  # of a log line: what the error test and the display read
_BLOCK = 1 << 20
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


def describe(rec: dict | Record) -> str:
    """``rank 1: RuntimeError: boom (at main.py:104 in main <- step.py:88 in __init__)``,
    one line, cut and escaped (a record's text is a child's word, not ours)."""
    get = rec.get if isinstance(rec, dict) else (lambda k, d=None: getattr(rec, k, d))
    where = " <- ".join(str(f) for f in reversed(list(get("frames") or [])[-3:]))
    kind, message = str(get("type", "")), str(get("message") or "")
    cause = f"{kind}: {message}" if message else kind
    line = f"{get('who', '?')}: {cause}" + (f" (at {where})" if where else "")
    return term(one_line(line, 2 * MAX_MESSAGE))


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


class Record(msgspec.Struct, forbid_unknown_fields=False):
    """A failure record as ``record`` writes it: the one shape a reader accepts."""

    who: Annotated[str, msgspec.Meta(max_length=200)]
    time: Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]  # Unix seconds (also refuses inf)
    type: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    message: Annotated[str, msgspec.Meta(max_length=4 * MAX_MESSAGE)] = ""
    frames: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=1000)]], msgspec.Meta(max_length=50)
    ] = []
    pid: int | None = None


_DECODER = msgspec.json.Decoder(Record)


def read_record(path: Path) -> Record | None:
    """The record in ``path``; None for anything else: not a plain file (a link, a FIFO, a
    directory), larger than ``MAX_RECORD`` bytes, not JSON, not an object, or a field that is
    missing, null or of another type. Never raises, never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_RECORD + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_RECORD:
        return None
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
        return None


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def recorded_cause(directory: str | os.PathLike, since: float = 0.0) -> str | None:
    """The earliest failure record written in ``directory`` after ``since``, described;
    a record that does not fit ``Record`` is named as ``unreadable record <path>`` (one line,
    escaped), never raised. None: no record since ``since``."""
    recs, bad = [], []
    try:
        paths = sorted(Path(directory).glob("*.json"))
    except OSError:
        return None
    for path in paths:
        rec = read_record(path)
        if rec is None:
            if _mtime(path) >= since:
                bad.append(path)
        elif rec.time >= since:
            recs.append(rec)
    unreadable = ""
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        unreadable = f"unreadable record {term(one_line(str(bad[0])))}{more}"
    if not recs:
        return unreadable or None
    first = min(recs, key=lambda r: r.time)
    more = f" (+{len(recs) - 1} more)" if len(recs) > 1 else ""
    return describe(first) + more + (f"; {unreadable}" if unreadable else "")


def _names_error(line: str) -> bool:
    head = line[:HEAD_CHARS]  # the regex and the noise test see the line's start only
    return bool(_ERROR_LINE.match(head)) and not any(n in head for n in _NOISE)


def _show(line: str) -> str:
    """One line for a terminal: whitespace collapsed, cut, control characters escaped."""
    return term(one_line(line[: 2 * HEAD_CHARS]))


def error_line(text: str, *, any_last: bool = False) -> str | None:
    """The last line of ``text`` that names an exception or an error (with ``any_last``,
    failing that, the last non-empty line), cut and escaped for display, or None."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _names_error(line):
            return _show(line)
    return _show(lines[-1]) if any_last and lines else None


def _line_start(f, end: int, max_scan: int) -> int:
    """Where the line holding byte ``end - 1`` starts: scan back for a newline in blocks
    (memory bounded; at most ``max_scan`` bytes, then -1: unknown)."""
    pos = end
    while pos > 0 and end - pos < max_scan:
        n = min(_BLOCK, pos)
        f.seek(pos - n)
        nl = f.read(n).rfind(b"\n")
        if nl >= 0:
            return pos - n + nl + 1
        pos -= n
    return 0 if pos == 0 else -1


def log_cause(
    log_path: str | os.PathLike, max_bytes: int = 64 << 10, max_scan: int = 1 << 30
) -> str | None:
    """The last line of a log that names an exception or an error, or None. The lines that
    end in the last ``max_bytes`` are read, however long: a line that starts before that
    window is found by scanning back for its start (up to ``max_scan`` bytes), and only its
    first characters are read. The line comes back cut and escaped (``_show``)."""
    try:
        fd = os.open(log_path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            lines = f.read(size - start).split(b"\n")
            for raw in reversed(lines[1:]):  # lines[0] may have begun before the window
                line = raw[: 4 * HEAD_CHARS].decode("utf-8", "replace")
                if _names_error(line):
                    return _show(line)
            begin = _line_start(f, start, max_scan) if start else 0
            if begin < 0:
                return None
            f.seek(begin)
            line = f.read(4 * HEAD_CHARS).split(b"\n", 1)[0].decode("utf-8", "replace")
            return _show(line) if _names_error(line) else None
    except OSError:
        return None


def died(kind: str, status: int | None, log_path: str | os.PathLike, when: str = "") -> str:
    """``<kind> exited with status N during start-up: <cause>; log: <path>``"""
    cause = log_cause(log_path) or "no error line in its log"
    what = f"exited with status {status}" if status is not None else "died"
    return f"{kind} {what}{' ' + when if when else ''}: {cause}; log: {log_path}"
