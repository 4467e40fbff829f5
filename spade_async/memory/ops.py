"""Write operations and how one is applied inside the writer's transaction.

Ops are typed structs so the writer task's stream carries nothing untyped. Each op keeps
the indexes in step with the record it changes (old entries out, new entries in) inside
the same transaction, so a crash at any point leaves records and indexes agreeing.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import lmdb
import msgspec

from spade_async.memory import dedup
from spade_async.memory import indexes as ix
from spade_async.memory.records import EnvRecord, Stats, encode, now


class Store(Protocol):
    """What an op needs of the store it runs in (``store.MemoryStore`` is one): its config,
    its named LMDB tables, and reads inside the writer's transaction."""

    config: Any  # store.MemoryConfig
    db: dict[str, Any]  # table name -> LMDB database handle

    def get(self, env_id: str, txn: lmdb.Transaction | None = None) -> EnvRecord | None: ...

    def meta_int(self, key: bytes, txn: lmdb.Transaction) -> int: ...


class PutOp(msgspec.Struct, frozen=True, kw_only=True):
    record: EnvRecord
    signature: bytes | None = None  # MinHash of the code (``prepare``); computed here if None


class StatsOp(msgspec.Struct, frozen=True, kw_only=True):
    env_id: str
    plays_hint: int = 0
    wins_hint: float = 0.0
    plays_nohint: int = 0
    wins_nohint: float = 0.0
    regret: float | None = None
    designer_reward: float | None = None
    version: int | None = None


class ReplayOp(msgspec.Struct, frozen=True, kw_only=True):
    env_ids: list[str]
    version: int


class HintOp(msgspec.Struct, frozen=True, kw_only=True):
    env_id: str
    hint: str


class QuarantineOp(msgspec.Struct, frozen=True, kw_only=True):
    env_id: str
    reason: str
    step: int


Op = PutOp | StatsOp | ReplayOp | HintOp | QuarantineOp


class PutResult(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    outcome: Literal["new", "near_duplicate", "exact_duplicate"]
    duplicate_of: str | None = None
    similarity: float | None = None


Result = PutResult | EnvRecord | None | int


def _replace(store: Store, txn: lmdb.Transaction, old: EnvRecord | None, new: EnvRecord) -> None:
    bounds = store.config.bounds()
    before = ix.entries(old, bounds) if old is not None else set()
    after = ix.entries(new, bounds)
    for table, key, value in before - after:
        txn.delete(key, value, db=store.db[table])
    for table, key, value in after - before:
        txn.put(key, value, db=store.db[table])
    txn.put(new.id.encode(), encode(new), db=store.db["records"])


def _bump(store: Store, txn: lmdb.Transaction, key: bytes) -> None:
    txn.put(key, str(store.meta_int(key, txn) + 1).encode(), db=store.db["meta"])


def _near_twin(store, txn, sig, keys) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for key in keys:
        cur = txn.cursor(store.db["bands"])
        if not cur.set_key(key):
            continue
        for rid in cur.iternext_dup(keys=False):
            other = txn.get(rid, db=store.db["sigs"])
            sim = dedup.jaccard(sig, dedup.from_bytes(other))
            if sim >= store.config.near_dup_threshold and (best is None or sim > best[1]):
                best = (rid.decode(), sim)
    return best


def _put(store: Store, txn: lmdb.Transaction, op: PutOp) -> PutResult:
    rec = op.record
    existing = store.get(rec.id, txn)
    if existing is not None:
        _replace(
            store,
            txn,
            existing,
            msgspec.structs.replace(
                existing, exact_repeats=existing.exact_repeats + 1, updated_at=now()
            ),
        )
        _bump(store, txn, b"exact_repeats")
        return PutResult(id=rec.id, outcome="exact_duplicate", duplicate_of=rec.id)
    t = now()
    rec = msgspec.structs.replace(rec, created_at=rec.created_at or t, updated_at=t)
    if not rec.valid:
        _replace(store, txn, None, rec)
        return PutResult(id=rec.id, outcome="new")
    cfg = store.config
    sig_bytes = op.signature or prepare_signature(rec, cfg.num_perm, cfg.shingle_tokens)
    sig = dedup.from_bytes(sig_bytes)
    keys = dedup.band_keys(sig, dedup.band_ranges(cfg.near_dup_threshold, cfg.num_perm))
    twin = _near_twin(store, txn, sig, keys)
    if twin is not None:
        rec = msgspec.structs.replace(rec, duplicate_of=twin[0], similarity=twin[1])
        original = store.get(twin[0], txn)
        _replace(
            store,
            txn,
            original,
            msgspec.structs.replace(original, near_copies=original.near_copies + 1),
        )
    else:
        for key in keys:
            txn.put(key, rec.id.encode(), db=store.db["bands"])
    txn.put(rec.id.encode(), sig_bytes, db=store.db["sigs"])
    _replace(store, txn, None, rec)
    if twin is None:
        return PutResult(id=rec.id, outcome="new")
    return PutResult(id=rec.id, outcome="near_duplicate", duplicate_of=twin[0], similarity=twin[1])


def _stats(store: Store, txn: lmdb.Transaction, op: StatsOp) -> EnvRecord | None:
    old = store.get(op.env_id, txn)
    if old is None:
        return None
    s = old.stats
    v = op.version
    stats = Stats(
        plays_hint=s.plays_hint + op.plays_hint,
        wins_hint=s.wins_hint + op.wins_hint,
        plays_nohint=s.plays_nohint + op.plays_nohint,
        wins_nohint=s.wins_nohint + op.wins_nohint,
        regret_sum=s.regret_sum + (op.regret or 0.0),
        regret_updates=s.regret_updates + (op.regret is not None),
        designer_reward_sum=s.designer_reward_sum + (op.designer_reward or 0.0),
        designer_reward_updates=s.designer_reward_updates + (op.designer_reward is not None),
        times_replayed=s.times_replayed,
        first_version=s.first_version if s.first_version is not None else v,
        last_version=v if v is not None else s.last_version,
    )
    new = msgspec.structs.replace(old, stats=stats, updated_at=now())
    _replace(store, txn, old, new)
    return new


def _replay(store: Store, txn: lmdb.Transaction, op: ReplayOp) -> int:
    done = 0
    for env_id in op.env_ids:
        old = store.get(env_id, txn)
        if old is None:
            continue
        s = old.stats
        stats = msgspec.structs.replace(
            s,
            times_replayed=s.times_replayed + 1,
            last_version=op.version,
            first_version=s.first_version if s.first_version is not None else op.version,
        )
        _replace(store, txn, old, msgspec.structs.replace(old, stats=stats, updated_at=now()))
        done += 1
    return done


def _hint(store: Store, txn: lmdb.Transaction, op: HintOp) -> EnvRecord | None:
    old = store.get(op.env_id, txn)
    if old is None:
        return None
    new = msgspec.structs.replace(old, hints=[*old.hints, op.hint], updated_at=now())
    _replace(store, txn, old, new)
    return new


def _quarantine(store: Store, txn: lmdb.Transaction, op: QuarantineOp) -> EnvRecord | None:
    """The first quarantine of a record stays (its reason and step)."""
    old = store.get(op.env_id, txn)
    if old is None or old.quarantine:
        return old
    new = msgspec.structs.replace(
        old, quarantine=op.reason or "quarantined", quarantine_step=op.step, updated_at=now()
    )
    _replace(store, txn, old, new)
    return new


def apply_one(store: Store, txn: lmdb.Transaction, op: Op) -> Result:
    if isinstance(op, PutOp):
        return _put(store, txn, op)
    if isinstance(op, StatsOp):
        return _stats(store, txn, op)
    if isinstance(op, HintOp):
        return _hint(store, txn, op)
    if isinstance(op, QuarantineOp):
        return _quarantine(store, txn, op)
    return _replay(store, txn, op)


def prepare_signature(rec: EnvRecord, num_perm: int, k: int) -> bytes:
    return dedup.signature(rec.code, num_perm=num_perm, k=k).tobytes()
