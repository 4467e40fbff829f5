"""``spade memory verify RUN [--repair]``: report on ``memory.lmdb``; copy what is readable.

``scan`` finds every environment record still in ``data.mdb`` by reading its pages with
plain file I/O (no mmap, so a truncated file cannot SIGBUS, and no B-tree walk, so a cut
or garbled branch page hides nothing written before it): each leaf node whose value
decodes as an ``EnvRecord`` keyed by its own id, and each overflow page run (a large
record) whose bytes decode as one. LMDB copies pages on write, so older versions of a
record may also be found: the newest (``updated_at``) wins. A record that fails
``records.record_problem`` (tampered id, unstorable skill) is not copied.

``repair`` writes the records to a fresh store (indexes and MinHash signatures rebuilt,
records byte-for-byte as found), moves the damaged store aside
(``memory.lmdb.damaged-<time>``) and puts the fresh one in its place.
"""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

from spade_async.memory import integrity as I  # noqa: N812
from spade_async.memory.records import EnvRecord, decode, record_problem

_U16, _U64 = struct.Struct("<H"), struct.Struct("<Q")


def msgpack_size(buf: bytes, pos: int = 0) -> int:
    """Bytes taken by the one msgpack object at ``buf[pos:]`` (ValueError: not one)."""
    start, todo = pos, 1
    fixed = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
             0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}  # fmt: skip
    sized = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
             0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}  # fmt: skip
    counted = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
    while todo:
        if pos >= len(buf):
            raise ValueError("cut short")
        b = buf[pos]
        pos += 1
        todo -= 1
        if b <= 0x7F or b >= 0xE0:
            continue
        if 0x80 <= b <= 0x8F:
            todo += 2 * (b & 0x0F)
        elif 0x90 <= b <= 0x9F:
            todo += b & 0x0F
        elif 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
        elif b in fixed:
            pos += fixed[b]
        elif b in sized:
            width, extra = sized[b]
            pos += width + extra + int.from_bytes(buf[pos : pos + width], "big")
        elif b in counted:
            width, per = counted[b]
            todo += per * int.from_bytes(buf[pos : pos + width], "big")
            pos += width
        else:
            raise ValueError(f"byte {b:#x} starts no msgpack object")
    if pos > len(buf):
        raise ValueError("cut short")
    return pos - start


def _record(raw: bytes, key: bytes | None = None) -> EnvRecord | None:
    try:
        rec = decode(raw)
    except Exception:  # noqa: BLE001 - not a record (another table, a stale or cut page)
        return None
    if (key is not None and rec.id.encode() != key) or record_problem(rec) is not None:
        return None
    return rec


def _leaf(data: bytes, off: int, psize: int) -> list[EnvRecord]:
    lower, upper = _U16.unpack_from(data, off + 12)[0], _U16.unpack_from(data, off + 14)[0]
    if not I.PAGEHDR <= lower <= upper <= psize:
        return []
    out = []
    for i in range((lower - I.PAGEHDR) // 2):
        ptr = _U16.unpack_from(data, off + I.PAGEHDR + 2 * i)[0]
        node = off + ptr
        if ptr < lower or node + 8 > len(data):
            continue
        lo, hi, flags, ksize = struct.unpack_from("<HHHH", data, node)
        size, key = lo | hi << 16, data[node + 8 : node + 8 + ksize]
        if flags == I.F_BIGDATA and node + 16 + ksize <= len(data):
            page = _U64.unpack_from(data, node + 8 + ksize)[0]
            raw = data[page * psize + I.PAGEHDR : page * psize + I.PAGEHDR + size]
        elif flags == 0:
            raw = data[node + 8 + ksize : node + 8 + ksize + size]
        else:
            continue  # a sub-database or duplicate set: an index, rebuilt on repair
        if len(raw) == size and (rec := _record(raw, key)) is not None:
            out.append(rec)
    return out


def scan(path: str | Path) -> dict[str, EnvRecord]:
    """id -> the newest readable version of every record found in ``path/data.mdb``."""
    data = (Path(path) / "data.mdb").read_bytes()
    psize = I.page_size(data[:256])
    found: dict[str, EnvRecord] = {}
    for off in range(2 * psize, len(data) - I.PAGEHDR, psize):
        flags = _U16.unpack_from(data, off + 10)[0]
        recs: list[EnvRecord] = []
        if flags & I.P_LEAF and not flags & (I.P_LEAF2 | I.P_SUBP | I.P_BRANCH | I.P_OVERFLOW):
            recs = _leaf(data, off, psize)
        elif flags & I.P_OVERFLOW and not flags & (I.P_LEAF | I.P_BRANCH):
            try:
                size = msgpack_size(data, off + I.PAGEHDR)
            except ValueError:
                continue
            rec = _record(data[off + I.PAGEHDR : off + I.PAGEHDR + size])
            recs = [rec] if rec is not None else []
        for rec in recs:
            old = found.get(rec.id)
            if old is None or rec.updated_at > old.updated_at:
                found[rec.id] = rec
    return found


def write_store(records: list[EnvRecord], dest: Path, config=None) -> None:
    """A fresh store at ``dest`` holding ``records`` exactly (indexes and signatures rebuilt)."""
    from spade_async.memory import dedup, ops
    from spade_async.memory.store import MemoryStore

    with MemoryStore(dest, config) as store:
        cfg = store.config
        bands = dedup.band_ranges(cfg.near_dup_threshold, cfg.num_perm)

        def fill(txn) -> None:
            for rec in records:
                if rec.valid:  # as ops._put leaves them: a signature, bands for originals
                    sig = ops.prepare_signature(rec, cfg.num_perm, cfg.shingle_tokens)
                    txn.put(rec.id.encode(), sig, db=store.db["sigs"])
                    if rec.duplicate_of is None:
                        for key in dedup.band_keys(dedup.from_bytes(sig), bands):
                            txn.put(key, rec.id.encode(), db=store.db["bands"])
                ops._replace(store, txn, None, rec)
            repeats = sum(r.exact_repeats for r in records)
            txn.put(b"exact_repeats", str(repeats).encode(), db=store.db["meta"])

        store._write(fill)


def verify(path: str | Path) -> dict:
    """{"damage": phrase or None, "records": readable by LMDB, "bad": n, "recoverable": n}:
    the file's meta pages and size, every record read in a child, then the indexes."""
    path = Path(path)
    header = I.header_problem(path)
    found = I.probe(path) if header is None else {"records": 0, "bad": [], "error": header}
    damage = I.describe(found)
    if damage is None:  # the records read whole: do the indexes agree with them?
        from spade_async.memory.store import MemoryStore

        with MemoryStore(path, readonly=True) as store:
            problems = store.check_consistency()
        if problems:
            damage = f"{len(problems)} index entries disagree with the records, e.g. {problems[0]}"
    try:
        recoverable = len(scan(path))
    except OSError:
        recoverable = 0
    return {"damage": damage, "records": found["records"], "bad": len(found["bad"]),
            "recoverable": recoverable}  # fmt: skip


def repair(path: str | Path, config=None) -> tuple[int, Path]:
    """Copy every readable record to a fresh store in ``path``'s place; (records, where
    the damaged store was moved)."""
    path = Path(path)
    records = sorted(scan(path).values(), key=lambda r: r.id)
    fresh = path.with_name(path.name + ".repairing")
    shutil.rmtree(fresh, ignore_errors=True)
    write_store(records, fresh, config)
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
    kept = path.with_name(f"{path.name}.damaged-{stamp}")
    while kept.exists():  # repaired twice in one second
        n += 1
        kept = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    path.rename(kept)
    fresh.rename(path)
    return len(records), kept


__all__ = ["msgpack_size", "repair", "scan", "verify", "write_store"]
