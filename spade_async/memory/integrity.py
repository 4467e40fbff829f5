"""Is ``memory.lmdb`` whole? Checked before a command reads it, and repaired on request.

LMDB maps ``data.mdb`` into memory and trusts its pages: a truncated file kills the reader
with SIGBUS on the first page past the end, and garbled pages can crash it (SIGSEGV) or
raise ``lmdb.CorruptedError``; one garbled record raises a decode error. So:

- ``header_problem``: the meta pages read with plain file I/O (magic, version, page size)
  and the file size against the last page they name: catches truncation, in-process, for
  every ``MemoryStore`` open (cheap).
- ``probe``: a child process opens the store read-only and reads every page a reader can
  reach (every table, every record decoded and checked by ``records.record_problem``). A
  signal, an LMDB error or a bad record is its answer; the command never crashes.
- ``store.open_checked``: both, then the store: every command that reads a run's memory opens
  it here and turns damage into one line (``DamagedMemory``, exit 2) naming the fix.
- ``repair.scan`` and ``repair.repair`` (``spade memory verify RUN --repair``): every
  record still in the file is found by reading real pages directly (``memory.pages``: the
  B-tree from each meta page, then a sweep of the pages no walk reached, never inside a
  stored value); the newest complete write of each id goes to a fresh store built with the
  run's ``[memory]`` settings and swapped in by ``memory.swap`` (one atomic step, or a
  journal the next open finishes); the damaged store is kept beside it.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
from pathlib import Path

from spade_async.errors import ConfigError

MAGIC, PAGEHDR = 0xBEEFC0DE, 16
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBP = 1, 2, 4, 8, 0x20, 0x40
F_BIGDATA = 1
PROBE_TIMEOUT_S = 120.0


class DamagedMemory(ConfigError):
    """A damaged store: the message names what is damaged and how to recover."""


def _fix(path: Path) -> str:
    return f"'spade memory verify {path.parent} --repair' copies every readable record into a fresh store"


def damaged(path: Path, why: str) -> DamagedMemory:
    from spade_async.safe_text import term

    return DamagedMemory(f"environment memory '{path}' is damaged ({term(why)}); {_fix(path)}")


def _meta(head: bytes, off: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of a valid meta page at ``off``."""
    if len(head) < off + 152:
        return None
    magic, version = struct.unpack_from("<II", head, off + 16)
    flags = struct.unpack_from("<H", head, off + 10)[0]
    psize = struct.unpack_from("<I", head, off + 40)[0]
    last, txnid = struct.unpack_from("<QQ", head, off + 136)
    if magic != MAGIC or version != 1 or not flags & P_META:
        return None
    return (psize, last, txnid) if psize in (4096, 8192, 16384, 65536) else None


def page_size(head: bytes) -> int:
    meta = _meta(head, 0)
    return meta[0] if meta is not None else 4096


def header_problem(path: str | Path) -> str | None:
    """What is wrong with ``path/data.mdb``'s meta pages or size (None: it looks whole)."""
    f = Path(path) / "data.mdb"
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(2 * 65536)
    except OSError as exc:
        return f"data.mdb cannot be read: {exc.strerror}"
    metas = []
    for off in (0, 4096, 8192, 16384, 65536):  # meta 0, then meta 1 one page further
        meta = _meta(head, off)
        if meta is not None and (off == 0 or off == meta[0]):
            metas.append(meta)
    if not metas:
        return f"data.mdb has no valid LMDB meta page ({size} bytes)"
    psize, last, _ = max(metas, key=lambda m: m[2])
    need = (last + 1) * psize
    if size < need:
        return f"data.mdb is {size} bytes, its last page ends at byte {need} (truncated)"
    return None


def _probe_main(path: str, tables: list[str], dupsort: list[str]) -> None:
    """The child (run as a script: the memory package's imports are not needed): read
    everything a reader can reach; print one JSON line."""
    import importlib.util

    import lmdb

    spec = importlib.util.spec_from_file_location(
        "_records", Path(__file__).with_name("records.py")
    )
    R = importlib.util.module_from_spec(spec)  # noqa: N806
    sys.modules["_records"] = R
    spec.loader.exec_module(R)
    out: dict = {"records": 0, "bad": [], "error": None}
    try:
        # a reader slot (lock=True): a live run's writer never reuses a page read here
        env = lmdb.open(path, readonly=True, max_dbs=len(tables) + 2, lock=True,
                        readahead=False)  # fmt: skip
        with env.begin() as txn:
            for name in tables:
                try:
                    db = env.open_db(name.encode(), txn=txn, create=False,
                                     dupsort=name in dupsort)  # fmt: skip
                except lmdb.NotFoundError:
                    continue
                for key, raw in txn.cursor(db):
                    if name != "records":
                        continue
                    try:
                        rec = R.decode(raw)
                        why = R.record_problem(rec) or (
                            None if rec.id.encode() == key else "its key is not its id"
                        )
                    except Exception as exc:  # noqa: BLE001 - a bad record is data
                        why = f"undecodable ({type(exc).__name__})"
                    out["records"] += 1
                    if why:
                        out["bad"].append([key[:80].decode("utf-8", "replace"), why])
    except lmdb.Error as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        damage = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError,
                  lmdb.VersionMismatchError, lmdb.PanicError, lmdb.IncompatibleError,
                  lmdb.BadChecksumError, lmdb.DiskError, lmdb.NotFoundError)  # fmt: skip
        # not the file's fault (a read-only directory, no reader slot): the store's own
        # open says so in its own words, never "damaged"
        out["error" if isinstance(exc, damage) else "unopenable"] = why
    print(json.dumps(out))


def probe(path: str | Path, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """{"records", "bad": [[key, why]], "error"}: what the child found. ``error`` is set
    when LMDB refused, the child died (a signal) or it ran past ``timeout``."""
    from spade_async.memory import indexes as ix

    boot = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; "
            "runpy.run_path(sys.argv[1], run_name='__main__')")  # fmt: skip
    root = str(Path(__file__).resolve().parents[2])  # spade_async's parent, for its imports
    cmd = [sys.executable, "-I", "-c", boot, root, __file__, "--probe", str(path),
           json.dumps(ix.TABLES), json.dumps(sorted(ix.DUPSORT))]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"records": 0, "bad": [], "error": f"reading it took over {timeout:.0f} s"}
    if p.returncode < 0:
        name = signal.Signals(-p.returncode).name
        return {"records": 0, "bad": [], "error": f"reading it crashed the reader ({name})"}
    try:
        return json.loads(p.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"records": 0, "bad": [], "error": f"the reader failed: {tail[0][:160]}"}


def problem(path: str | Path) -> str | None:
    """One phrase naming the damage (None: the store reads whole)."""
    why = header_problem(path)
    if why is not None:
        return why
    return describe(probe(path))


def describe(found: dict) -> str | None:
    """One phrase for what ``probe`` found (None: nothing wrong)."""
    if found["error"]:
        return found["error"]
    if found["bad"]:
        key, what = found["bad"][0]
        n, total = len(found["bad"]), found["records"]
        return f"{n} of {total} records unreadable, e.g. '{key[:16]}': {what}"
    return None


if __name__ == "__main__" and sys.argv[2:3] == ["--probe"]:
    _probe_main(sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5]))
