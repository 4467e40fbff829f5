"""``spade memory verify RUN [--repair]``: report on ``memory.lmdb``; copy what is readable.

``scan`` finds every environment record still in ``data.mdb`` by reading its pages with
plain file I/O (no mmap, so a truncated file cannot SIGBUS): the ``records`` B-tree walked
from each valid meta page, then a sweep of every real page no walk reached, for what a
cut or garbled branch hides (``memory.pages``: only pages whose structure holds are read,
and never the inside of a stored value, so a value holding a page image forges nothing).
LMDB copies pages on write, so older versions of a record may be found too. Which copy
is kept (``rank``): the one the newest meta page's tree reaches (the last committed
write), when the two meta pages agree (consecutive transaction ids); otherwise the
latest ``updated_at`` (a value that is not finite never wins), then the most progress
(every update adds to a counter: plays, regret and reward updates, replays, exact
repeats, near copies, hints, a quarantine), then the bytes (a fixed order, never "first
found"). A record that fails ``records.record_problem`` (tampered id, unstorable
skill) is not copied.

``repair`` reads the run's ``[memory]`` settings from ``RUN/config.toml`` (MinHash
``num_perm``, bands, class bounds), writes the records to a fresh store (indexes and
signatures rebuilt, records byte-for-byte as found) and swaps it in with one atomic step
(``memory.swap``); the damaged store is kept beside it (``memory.lmdb.damaged-<time>``).
"""

from __future__ import annotations

import math
from pathlib import Path

from spade_async.errors import ConfigError
from spade_async.memory import integrity as I  # noqa: N812
from spade_async.memory import swap
from spade_async.memory.pages import Pages
from spade_async.memory.records import EnvRecord, decode, record_problem


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


def progress(rec: EnvRecord) -> int:
    """A count every update of a record raises (stats are sums, hints only grow)."""
    s, quarantined = rec.stats, bool(getattr(rec, "quarantine", ""))  # set once, kept
    return (s.plays_hint + s.plays_nohint + s.regret_updates + s.designer_reward_updates
            + s.times_replayed + rec.exact_repeats + rec.near_copies + len(rec.hints)
            + quarantined)  # fmt: skip


def rank(rec: EnvRecord, raw: bytes, live: bool) -> tuple:
    """The order copies of one record are kept by (highest wins; see the docstring)."""
    t = rec.updated_at if math.isfinite(rec.updated_at) else -math.inf
    return (live, t, progress(rec), raw)


def scan_image(data: bytes) -> tuple[dict[str, EnvRecord], Pages]:
    """id -> the kept copy of every record in the ``data.mdb`` image ``data``; the reader
    (its ``work`` counts the bytes examined)."""
    copies, pages = scan_copies(data)
    return {k: rec for k, (rec, _) in copies.items()}, pages


def scan_copies(data: bytes) -> tuple[dict[str, tuple[EnvRecord, bytes]], Pages]:
    """id -> (the kept copy, its bytes as found) of every record in ``data``; the reader."""
    pages = Pages(data)
    best: dict[str, tuple[tuple, EnvRecord]] = {}

    def offer(rec: EnvRecord | None, raw: bytes, live: bool) -> None:
        if rec is None:
            return
        r = rank(rec, raw, live)
        if rec.id not in best or r > best[rec.id][0]:
            best[rec.id] = (r, rec)

    ms = pages.metas  # the newest tree is the last commit only when the metas agree
    agree = len(ms) == 2 and ms[0].txnid == ms[1].txnid + 1
    for i, meta in enumerate(ms):
        for key, raw in pages.tree(meta):
            offer(_record(raw, key), raw, agree and i == 0)
    for key, raw in pages.sweep():
        if key is None:  # a whole overflow run: the value is the msgpack object it starts with
            try:
                raw = raw[: msgpack_size(raw)]
            except ValueError:
                continue
        offer(_record(raw, key), raw, False)
    return {k: (v[1], v[0][-1]) for k, v in best.items()}, pages


def scan(path: str | Path) -> dict[str, EnvRecord]:
    """id -> the kept version of every record found in ``path/data.mdb``."""
    return scan_image((Path(path) / "data.mdb").read_bytes())[0]


def run_memory_config(path: Path):
    """The ``[memory]`` settings of the run that holds ``path`` (``RUN/config.toml``);
    the defaults when the run has no config.toml."""
    from spade_async.config import convert, known_only, read_toml
    from spade_async.memory.store import MemoryConfig

    cfg = path.parent / "config.toml"
    if not cfg.is_file():
        return MemoryConfig()
    table = read_toml(cfg).get("memory", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{cfg}: [memory] is not a table; fix it before repairing")
    try:
        return convert(MemoryConfig, known_only(MemoryConfig, table)[0], at="memory")
    except ConfigError as exc:
        raise ConfigError(f"{cfg}: [memory] {exc}; fix the value before repairing "
                          "(the repaired store's indexes follow it)") from None  # fmt: skip


def write_store(
    records: list[EnvRecord], dest: Path, config=None, raw: dict[str, bytes] | None = None
) -> None:
    """A fresh store at ``dest`` holding ``records`` exactly (indexes and signatures
    rebuilt); ``raw``: id -> the bytes a record was found as, stored as they are."""
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
                if raw is not None:  # byte for byte (a newer schema's defaults not added)
                    txn.put(rec.id.encode(), raw[rec.id], db=store.db["records"])
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
    the damaged store was moved). ``config``: the run's ``[memory]`` settings when None."""
    path = Path(path)
    config = config if config is not None else run_memory_config(path)
    swap.finish(path)
    copies = scan_copies((path / "data.mdb").read_bytes())[0]
    records = sorted((rec for rec, _ in copies.values()), key=lambda r: r.id)
    raw = {k: found for k, (_, found) in copies.items()}
    try:
        kept = swap.install(path, lambda fresh: write_store(records, fresh, config, raw))
    except OSError as exc:
        raise ConfigError(
            f"cannot repair '{path}': {exc.strerror or exc} ({exc.filename}); the store is "
            "unchanged or its repair is finished by the next command that opens it"
        ) from None
    return len(records), kept


__all__ = ["msgpack_size", "progress", "rank", "repair", "run_memory_config", "scan",
           "scan_copies", "scan_image", "verify", "write_store"]  # fmt: skip
