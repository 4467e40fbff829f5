"""JSONL corpora (``{"text": ...}`` or SPICE's ``{"orig_doc": ...}``) with a cached offset index.

The first open scans the file once in 16 MiB blocks (progress bar on a terminal), checks
every line, and writes the byte offsets of the good ones (numpy ``uint64``) plus their line
numbers to the cache directory, keyed by the file's absolute path, size and mtime. Later
opens load the index in milliseconds; sampling seeks to one offset and reads one line, so a
corpus of any size is never held in memory. Malformed lines are skipped and counted.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import msgspec
import numpy as np

from spade_async.corpus.base import pick_text
from spade_async.errors import ConfigError
from spade_async.models import cache_root
from spade_async.telemetry.progress import track

BLOCK = 16 << 20


class JsonlIndex(msgspec.Struct, frozen=True, kw_only=True):
    """Summary of one scan (the arrays live in the .npz beside it)."""

    lines: int
    skipped: int
    first_bad_line: int | None


def _cache_path(path: Path, fields: list[str]) -> Path:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{','.join(fields)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_root() / "corpus-index" / f"{path.name}-{digest}.npz"


def _blocks(f, size: int):
    n_blocks = max(1, -(-size // BLOCK))
    for _ in track(range(n_blocks), f"indexing {Path(f.name).name}", total=n_blocks):
        block = f.read(BLOCK)
        if not block:
            return
        yield block
    while block := f.read(BLOCK):  # the file grew while we read it
        yield block


def _scan(path: Path, fields: list[str]) -> tuple[np.ndarray, np.ndarray, JsonlIndex]:
    offsets: list[int] = []
    line_nos: list[int] = []
    skipped, first_bad, line_no, pos, carry = 0, None, 0, 0, b""
    decode = msgspec.json.Decoder().decode

    def check(line: bytes, start: int) -> None:
        nonlocal skipped, first_bad
        if not line.strip():
            return
        try:
            ok = pick_text(decode(line), fields) is not None
        except (msgspec.DecodeError, UnicodeDecodeError):
            ok = False
        if ok:
            offsets.append(start)
            line_nos.append(line_no)
        else:
            skipped += 1
            first_bad = first_bad or line_no

    with open(path, "rb") as f:
        for block in _blocks(f, path.stat().st_size):
            data = carry + block
            start = 0
            while (nl := data.find(b"\n", start)) >= 0:
                line_no += 1
                check(data[start:nl], pos + start)
                start = nl + 1
            pos += start
            carry = data[start:]
        if carry:
            line_no += 1
            check(carry, pos)
    index = JsonlIndex(lines=line_no, skipped=skipped, first_bad_line=first_bad)
    return np.asarray(offsets, np.uint64), np.asarray(line_nos, np.uint64), index


def load_index(path: Path, fields: list[str]) -> tuple[np.ndarray, np.ndarray, JsonlIndex]:
    cache = _cache_path(path, fields)
    if cache.is_file():
        with np.load(cache) as z:
            return (
                z["offsets"],
                z["line_nos"],
                msgspec.json.decode(z["meta"].tobytes(), type=JsonlIndex),
            )
    offsets, line_nos, index = _scan(path, fields)
    cache.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache.parent, suffix=".npz")
    with os.fdopen(fd, "wb") as out:
        meta = np.frombuffer(msgspec.json.encode(index), dtype=np.uint8)
        np.savez(out, offsets=offsets, line_nos=line_nos, meta=meta)
    os.replace(tmp, cache)
    return offsets, line_nos, index


class JsonlReader:
    def __init__(self, path: Path, fields: list[str]):
        self.path = path
        self.name = path.name
        self.fields = fields
        self.offsets, self.line_nos, self.index = load_index(path, fields)
        if len(self.offsets) == 0:
            bad = (
                f"; all {self.index.skipped} non-blank lines are malformed or lack a "
                f"{' / '.join(fields)} string (first: line {self.index.first_bad_line})"
                if self.index.skipped
                else ""
            )
            raise ConfigError(
                f"corpus '{path}' has no documents{bad}; pass a JSONL file with "
                'one {"text": ...} object per line'
            )
        self._f = open(path, "rb")  # noqa: SIM115 - kept open for seeks, closed in close()

    @property
    def warning(self) -> str | None:
        if not self.index.skipped:
            return None
        return (
            f"corpus '{self.path}': skipped {self.index.skipped} malformed line(s) "
            f"(first: line {self.index.first_bad_line})"
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def read(self, index: int) -> tuple[str, str]:
        self._f.seek(int(self.offsets[index]))
        obj = msgspec.json.decode(self._f.readline())
        own = obj.get("id")
        doc_id = (
            str(own) if isinstance(own, str | int) else f"{self.name}:{int(self.line_nos[index])}"
        )
        return doc_id, pick_text(obj, self.fields) or ""

    def close(self) -> None:
        self._f.close()
