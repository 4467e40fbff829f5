"""Designer-context and replay sampling, served from the LMDB indexes (no full scans).

- ``spade`` (default): as the reference (``env_memory.py``), over the context window -- the
  newest ``window`` valid records of any skill (the reference's FIFO of 200; memory itself
  keeps everything): ``n_positive`` same-skill positives (no-hint win rate in
  [positive_low, positive_high]) drawn at random from the ``max(3 n, 10)`` highest-regret
  ones, plus ``n_negative`` negatives, too easy or too hard, each named by its class, drawn
  at random. When the skill has no positive yet (a fresh run), up to ``n_positive``
  not-yet-played environments (the bundled or imported ones) are shown as ``seed``
  examples, same skill first, so they reach the prompt from the start. ``window=None``
  reads the whole memory through the ``ctx`` index instead (regret order, no window).
- ``recent``: the newest valid environments of the skill (``recent`` index, read backwards).
- ``diverse``: greedy max-min MinHash-Jaccard distance over the ``diverse_pool``
  highest-regret positives (newest environments when there are too few positives).
- ``replay`` (agent): PLR (Jiang et al., 2021) over the ``replay_buffer`` highest-regret
  environments: P = (1 - rho) * rank-prioritised(regret, beta) + rho * staleness.
Every path touches O(k) or O(buffer) entries, never the whole memory.
"""

from __future__ import annotations

import itertools
from typing import Literal

import msgspec
import numpy as np

from spade_async.errors import ConfigError
from spade_async.memory import dedup
from spade_async.memory import indexes as ix
from spade_async.memory.records import EnvRecord, ctx_class, decode
from spade_async.memory.store import MemoryStore

Strategy = Literal["spade", "recent", "diverse"]


class Example(msgspec.Struct, frozen=True, kw_only=True):
    """One memory example for the designer prompt."""

    role: Literal["positive", "too_easy", "too_hard", "recent", "diverse", "seed"]
    record: EnvRecord


def _records(store, txn, ids: list[bytes]) -> list[EnvRecord]:
    return [decode(txn.get(i, db=store.db["records"])) for i in ids]


def _positives(store: MemoryStore, txn, skill: str, n: int) -> list[bytes]:
    cur = txn.cursor(store.db["ctx"])
    if not cur.set_key(ix.ctx_key(skill, "positive")):
        return []
    out = []
    for value in cur.iternext_dup(keys=False):
        out.append(value[8:])
        if len(out) >= n:
            break
    return out


def _random_in(store: MemoryStore, txn, key: bytes, rng: np.random.Generator) -> bytes | None:
    cur = txn.cursor(store.db["ctx"])
    if not cur.set_key(key):
        return None
    probe = rng.bytes(32).hex().encode()  # ids are sha256 hex: uniform over the key space
    if cur.set_range_dup(key, probe):
        return cur.value()
    cur.set_key(key)
    return cur.value()  # probe past the last id: wrap to the first


def _recent(store: MemoryStore, txn, skill: str | None, n: int) -> list[bytes]:
    prefix = ix.recent_prefix(skill)
    cur = txn.cursor(store.db["recent"])
    upper = prefix + b"\xff" * 9
    if not cur.set_range(upper):
        if not cur.last():
            return []
    elif not cur.prev():
        return []
    out = []
    while cur.key().startswith(prefix) and len(out) < n:
        out.append(cur.key()[len(prefix) + 8 :])
        if not cur.prev():
            break
    return out


def designer_context(
    store: MemoryStore,
    skill: str,
    *,
    strategy: Strategy = "spade",
    k: int | None = None,
    rng: np.random.Generator | None = None,
    window: int | None = None,
) -> list[Example]:
    """Memory examples for a designer prompt about ``skill`` (``window``: see above)."""
    cfg = store.config
    rng = rng or np.random.default_rng()
    with store.read() as txn:
        if strategy == "spade" and window is not None:
            return _spade_window(store, txn, skill, window, rng)
        if strategy == "spade":
            out = [
                Example(role="positive", record=r)
                for r in _records(store, txn, _positives(store, txn, skill, cfg.n_positive))
            ]
            classes = [
                c
                for c in ("too_easy", "too_hard")
                if txn.cursor(store.db["ctx"]).set_key(ix.ctx_key(skill, c))
            ]
            seen: set[bytes] = set()
            for _ in range(4 * cfg.n_negative if classes else 0):  # a few probes for distinct
                if len(seen) == cfg.n_negative:
                    break
                cls = classes[int(rng.integers(len(classes)))]
                rid = _random_in(store, txn, ix.ctx_key(skill, cls), rng)
                if rid not in seen:
                    seen.add(rid)
                    out.append(Example(role=cls, record=_records(store, txn, [rid])[0]))
            return out
        n = k or cfg.n_positive + cfg.n_negative
        if strategy == "recent":
            return [
                Example(role="recent", record=r)
                for r in _records(store, txn, _recent(store, txn, skill, n))
            ]
        if strategy == "diverse":
            pool = _positives(store, txn, skill, cfg.diverse_pool)
            if len(pool) < n:
                pool += [i for i in _recent(store, txn, skill, cfg.diverse_pool) if i not in pool]
            picked = _max_min(store, txn, pool, n)
            return [Example(role="diverse", record=r) for r in _records(store, txn, picked)]
    raise ConfigError(f"context strategy '{strategy}' is unknown; use spade, recent or diverse")


def _spade_window(
    store: MemoryStore, txn, skill: str, window: int, rng: np.random.Generator
) -> list[Example]:
    cfg = store.config
    bounds = {
        "low": cfg.positive_low,
        "high": cfg.positive_high,
        "easy": cfg.too_easy_above,
        "hard": cfg.too_hard_below,
    }
    recs = _records(store, txn, _recent(store, txn, None, window))  # newest first
    classes = {r.id: ctx_class(r, **bounds) for r in recs}
    mine = [r for r in recs if r.skill == skill]
    pos = sorted(
        (r for r in mine if classes[r.id] == "positive"), key=lambda r: -(r.stats.regret or 0.0)
    )
    pool = pos[: max(3 * cfg.n_positive, 10)]
    out = [Example(role="positive", record=r) for r in _pick(pool, cfg.n_positive, rng)]
    if not out:  # nothing played yet: the unplayed (bundled, imported) environments
        fresh = [r for r in recs if r.stats.plays_nohint == 0]
        seeds = [r for r in fresh if r.skill == skill] or fresh
        out = [Example(role="seed", record=r) for r in _pick(seeds, cfg.n_positive, rng)]
    bad = [r for r in mine if classes[r.id] in ("too_easy", "too_hard")]
    out += [Example(role=classes[r.id], record=r) for r in _pick(bad, cfg.n_negative, rng)]
    return out


def _pick(items: list, n: int, rng: np.random.Generator) -> list:
    """``n`` distinct items at random, kept in their given order."""
    if len(items) <= n:
        return list(items)
    return [items[i] for i in sorted(rng.choice(len(items), size=n, replace=False))]


def _max_min(store: MemoryStore, txn, pool: list[bytes], n: int) -> list[bytes]:
    """Greedy max-min Jaccard distance, seeded with the first (highest-regret) candidate."""
    if len(pool) <= n:
        return pool
    sigs = np.stack([dedup.from_bytes(txn.get(i, db=store.db["sigs"])) for i in pool])
    chosen = [0]
    min_dist = 1.0 - (sigs == sigs[0]).mean(axis=1)
    while len(chosen) < n:
        nxt = int(np.argmax(min_dist))
        chosen.append(nxt)
        min_dist = np.minimum(min_dist, 1.0 - (sigs == sigs[nxt]).mean(axis=1))
        min_dist[chosen] = -1.0
    return [pool[i] for i in chosen]


class _ReplayBuffer(msgspec.Struct):
    """The top of the ``replay`` index as arrays, valid for one LMDB transaction id."""

    txnid: int
    ids: np.ndarray  # uint8[B, 64]: hex ids, regret-descending
    last: np.ndarray  # int64[B]: last policy version that played each one
    p_rank: np.ndarray  # float64[B]: rank prioritisation (1 / rank) ** (1 / beta), normalised


def _replay_buffer(store: MemoryStore) -> _ReplayBuffer:
    txnid = store.env.info()["last_txnid"]
    cached = store.cache.get("replay")
    if cached is not None and cached.txnid == txnid:
        return cached  # nothing was committed since: reuse the arrays
    with store.read() as txn:  # keys only (inv-regret 8 + id 64 + version 8): one C-level join
        cur = txn.cursor(store.db["replay"])
        blob = b"".join(itertools.islice(cur.iternext(values=False), store.config.replay_buffer))
    rows = np.frombuffer(blob, dtype=np.uint8).reshape(-1, 80)
    last = rows[:, 72:].copy().view(">i8").astype(np.int64).reshape(-1)
    rank = np.arange(1, len(rows) + 1, dtype=np.float64)  # index order is regret-descending
    score = (1.0 / rank) ** (1.0 / store.config.replay_temperature)
    buf = _ReplayBuffer(txnid=txnid, ids=rows[:, 8:72], last=last, p_rank=score / score.sum())
    store.cache["replay"] = buf
    return buf


def replay_sample(
    store: MemoryStore, n: int, *, version: int, rng: np.random.Generator | None = None
) -> list[str]:
    """PLR replay: ``n`` distinct environment ids for the agent at policy ``version``.

    Score = rank of regret within the level buffer, ``h = (1 / rank) ** (1 / beta)``;
    staleness ``version - last_version``. Mark the chosen ones with ``ReplayOp`` so their
    staleness resets. The buffer's arrays are cached until the next commit.
    """
    cfg = store.config
    rng = rng or np.random.default_rng()
    buf = _replay_buffer(store)
    size = len(buf.last)
    if size == 0:
        return []
    stale = np.maximum(version - buf.last, 0).astype(np.float64)
    total = stale.sum()
    p_stale = stale / total if total > 0 else np.full(size, 1.0 / size)
    p = (1.0 - cfg.replay_staleness) * buf.p_rank + cfg.replay_staleness * p_stale
    p /= p.sum()
    m = min(n, int(np.count_nonzero(p)))
    picks = rng.choice(size, size=m, replace=False, p=p)
    return [buf.ids[i].tobytes().decode() for i in picks]
