"""``memory.lmdb``: durable environment memory with secondary indexes and dedup.

One process writes (``apply`` a batch of ops in one durable transaction; in the controller
only ``MemoryWriter``'s task calls it); any number read concurrently (LMDB MVCC). The map
starts small and doubles whenever a transaction hits ``MDB_MAP_FULL`` (the transaction is
retried), so callers never see it; readers adopt a map grown by another process.

Side effects of the runtime (py-lmdb): a lock file beside ``data.mdb`` and one reader slot
per open read transaction; commits fsync (``sync=True``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import msgspec

from spade_async.config import Doc
from spade_async.errors import ConfigError
from spade_async.memory import dedup, ops
from spade_async.memory import indexes as ix
from spade_async.memory.records import SCHEMA_VERSION, EnvRecord, decode, newer_schema

MIB = 1 << 20


class MemoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Environment memory: storage, dedup and context/replay sampling."""

    initial_map_mib: Doc(int, "LMDB map size to start with (MiB); doubles on demand") = 64
    max_batch: Doc(int, "most write ops the writer task commits in one transaction") = 512
    queue_size: Doc(int, "bound of the writer task's input stream") = 4096
    near_dup_threshold: Doc(
        float, "estimated Jaccard similarity at or above which an environment is a near-duplicate"
    ) = 0.85
    num_perm: Doc(int, "MinHash permutations per signature") = 64
    shingle_tokens: Doc(int, "code tokens per shingle for MinHash") = 5
    positive_low: Doc(float, "designer-context positives: lowest no-hint win rate") = 0.15
    positive_high: Doc(float, "designer-context positives: highest no-hint win rate") = 0.85
    too_easy_above: Doc(float, "a negative is too easy above this no-hint win rate") = 0.9
    too_hard_below: Doc(float, "a negative is too hard below this no-hint win rate") = 0.1
    n_positive: Doc(int, "same-skill positives shown to the designer") = 2
    n_negative: Doc(int, "negatives (too easy / too hard) shown to the designer") = 1
    diverse_pool: Doc(int, "candidates the 'diverse' strategy picks its max-min set from") = 64
    replay_buffer: Doc(
        int, "PLR level buffer: the highest-regret environments replay draws from"
    ) = 4096
    replay_temperature: Doc(float, "PLR rank-prioritisation temperature (beta)") = 0.1
    replay_staleness: Doc(float, "PLR staleness mixing weight (rho)") = 0.3

    def bounds(self) -> dict[str, float]:
        return {
            "low": self.positive_low,
            "high": self.positive_high,
            "easy": self.too_easy_above,
            "hard": self.too_hard_below,
        }


class MemoryStore:
    """Open (or create) ``path`` (a directory, e.g. ``RUN_DIR/memory.lmdb``)."""

    def __init__(
        self, path: str | Path, config: MemoryConfig | None = None, *, readonly: bool = False
    ):
        self.path = Path(path)
        self.config = config or MemoryConfig()
        self.readonly = readonly
        from spade_async.memory import swap

        swap.finish(self.path)  # a repair a kill interrupted: completed before any read
        self.cache: dict[str, object] = {}  # readers' caches, each checked against last_txnid
        if not readonly:  # fail fast (a reader never bands: it skips datasketch's import)
            dedup.band_ranges(self.config.near_dup_threshold, self.config.num_perm)
        if readonly and not (self.path / "data.mdb").is_file():
            raise ConfigError(
                f"no environment memory at '{self.path}'; pass the run directory "
                "of a run that has one (RUN_DIR/memory.lmdb)"
            )
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        data = self.path / "data.mdb"
        if data.is_file() and data.stat().st_size > 0:  # a cut file would SIGBUS a reader
            from spade_async.memory import integrity

            why = integrity.header_problem(self.path)
            if why is not None:
                raise integrity.damaged(self.path, why)
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=self.config.initial_map_mib * MIB,
                max_dbs=len(ix.TABLES) + 2,
                readonly=readonly,
                sync=True,
                metasync=True,
                readahead=False,
            )
        except lmdb.Error as exc:
            raise ConfigError(f"cannot open environment memory '{self.path}': {exc}") from None
        self.db = {
            name: self.env.open_db(name.encode(), dupsort=name in ix.DUPSORT, create=not readonly)
            for name in ix.TABLES
        }
        try:
            self._check_schema()
        except BaseException:
            self.env.close()
            raise

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema and transactions -------------------------------------------------------
    def _check_schema(self) -> None:
        with self.read() as txn:
            raw = txn.get(b"schema_version", db=self.db["meta"])
            bounds = txn.get(b"bounds", db=self.db["meta"])
        if raw is not None and int(raw) > SCHEMA_VERSION:
            raise newer_schema(int(raw), f"memory store '{self.path}'")
        if self.readonly:
            return
        want = msgspec.json.encode(self.config.bounds())
        if bounds is not None and bounds != want:
            self.rebuild_indexes()  # win-rate class thresholds changed: the ctx index follows
        if raw is None or bounds != want:

            def stamp(txn: lmdb.Transaction) -> None:
                txn.put(b"schema_version", str(SCHEMA_VERSION).encode(), db=self.db["meta"])
                txn.put(b"bounds", want, db=self.db["meta"])

            self._write(stamp)

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        try:
            txn = self.env.begin()
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)  # another process grew the map: adopt its size
            txn = self.env.begin()
        try:
            yield txn
        finally:
            txn.abort()

    @contextmanager
    def _write_txn(self) -> Iterator[lmdb.Transaction]:
        with self.env.begin(write=True) as txn:
            yield txn

    def apply(self, batch: list[ops.Op]) -> list[ops.Result]:
        """Apply ``batch`` in one durable transaction; grow the map and retry when full."""
        if self.readonly:
            raise ConfigError(f"memory '{self.path}' is open read-only")
        return self._write(lambda txn: [ops.apply_one(self, txn, op) for op in batch])

    def _write(self, fn):
        while True:
            try:
                with self._write_txn() as txn:
                    return fn(txn)
            except lmdb.MapFullError:  # the txn was aborted: double the map, run it again
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    # -- convenience writes (synchronous; the controller goes through MemoryWriter) -----
    def put(self, record: EnvRecord, signature: bytes | None = None) -> ops.PutResult:
        return self.apply([ops.PutOp(record=record, signature=signature)])[0]

    def update_stats(
        self,
        env_id: str,
        *,
        plays_hint: int = 0,
        wins_hint: float = 0.0,
        plays_nohint: int = 0,
        wins_nohint: float = 0.0,
        regret: float | None = None,
        designer_reward: float | None = None,
        version: int | None = None,
    ) -> EnvRecord | None:
        """Accumulate one window's play into ``env_id``'s stats (None if it is unknown)."""
        op = ops.StatsOp(
            env_id=env_id,
            plays_hint=plays_hint,
            wins_hint=wins_hint,
            plays_nohint=plays_nohint,
            wins_nohint=wins_nohint,
            regret=regret,
            designer_reward=designer_reward,
            version=version,
        )
        return self.apply([op])[0]

    # -- reads ---------------------------------------------------------------------------
    def get(self, env_id: str, txn: lmdb.Transaction | None = None) -> EnvRecord | None:
        if txn is None:
            with self.read() as txn:
                return self.get(env_id, txn)
        raw = txn.get(env_id.encode(), db=self.db["records"])
        return None if raw is None else decode(raw)

    def resolve(self, prefix: str) -> EnvRecord:
        """The record whose id starts with ``prefix`` (at least 4 hex digits, unique)."""
        if len(prefix) < 4:
            raise ConfigError(f"environment id '{prefix}' is too short; give at least 4 characters")
        want = prefix.encode("utf-8", "surrogatepass")  # argv may hold undecodable bytes
        with self.read() as txn:
            cur = txn.cursor(self.db["records"])
            found = []
            if cur.set_range(want):
                for key, raw in cur:
                    if not key.startswith(want) or len(found) > 1:
                        break
                    found.append(raw)
        if not found:
            raise ConfigError(
                f"no environment with id '{prefix}' in '{self.path}'; "
                "list them with 'spade memory ls'"
            )
        if len(found) > 1:
            raise ConfigError(f"environment id '{prefix}' is ambiguous; give more characters")
        return decode(found[0])

    def records(
        self, *, status: str | None = None, skill: str | None = None, limit: int | None = None
    ) -> Iterator[EnvRecord]:
        """Records in id order, or through the status / skill index when one is given."""
        with self.read() as txn:
            if status is None and skill is None:
                it = (raw for _, raw in txn.cursor(self.db["records"]))
            else:
                table, key = ("status", status) if status is not None else ("skill", skill)
                cur = txn.cursor(self.db[table])
                ids = cur.iternext_dup(keys=False) if cur.set_key(key.encode()) else iter(())
                it = (txn.get(i, db=self.db["records"]) for i in ids)
            for n, raw in enumerate(it):
                if limit is not None and n >= limit:
                    return
                rec = decode(raw)
                if skill is not None and rec.skill != skill:
                    continue
                yield rec

    def count(self, table: str, key: bytes) -> int:
        with self.read() as txn:
            cur = txn.cursor(self.db[table])
            return cur.count() if cur.set_key(key) else 0

    def keys(self, table: str) -> list[bytes]:
        with self.read() as txn:
            return list(txn.cursor(self.db[table]).iternext_nodup(keys=True, values=False))

    def meta_int(self, key: bytes, txn: lmdb.Transaction | None = None) -> int:
        if txn is None:
            with self.read() as txn:
                return self.meta_int(key, txn)
        raw = txn.get(key, db=self.db["meta"])
        return int(raw) if raw else 0

    def stats(self) -> dict:
        with self.read() as txn:
            total = txn.stat(self.db["records"])["entries"]
            exact = self.meta_int(b"exact_repeats", txn)
        skills = {k.decode(): self.count("skill", k) for k in self.keys("skill")}
        bands = {k.decode(): self.count("band", k) for k in self.keys("band")}
        invalid = self.count("status", b"invalid")
        return {
            "total": total,
            "valid": total - invalid,
            "invalid": invalid,
            "duplicates": self.count("status", b"duplicate"),
            "exact_repeats": exact,
            "by_skill": skills,
            "regret_bands": bands,
            "map_size_mib": self.env.info()["map_size"] // MIB,
            "schema_version": SCHEMA_VERSION,
        }

    # -- maintenance ---------------------------------------------------------------------
    def expected_entries(self) -> set[ix.Entry]:
        bounds = self.config.bounds()
        return {e for rec in self.records() for e in ix.entries(rec, bounds)}

    def actual_entries(self) -> set[ix.Entry]:
        with self.read() as txn:
            return {(t, k, v) for t in ix.INDEXES for k, v in txn.cursor(self.db[t])}

    def check_consistency(self) -> list[str]:
        """Problems found (empty when every index agrees with the records)."""
        want, have = self.expected_entries(), self.actual_entries()
        problems = [f"missing {t} entry {k!r} -> {v!r}" for t, k, v in sorted(want - have)]
        problems += [f"stale {t} entry {k!r} -> {v!r}" for t, k, v in sorted(have - want)]
        with self.read() as txn:
            n_sigs = txn.stat(self.db["sigs"])["entries"]
            n_rec = txn.stat(self.db["records"])["entries"]
            for rid, _ in txn.cursor(self.db["sigs"]):
                if txn.get(rid, db=self.db["records"]) is None:
                    problems.append(f"signature without record {rid!r}")
        if n_sigs > n_rec:
            problems.append(f"{n_sigs} signatures for {n_rec} records")
        return problems

    def rebuild_indexes(self) -> None:
        entries = self.expected_entries()

        def rebuild(txn: lmdb.Transaction) -> None:
            for t in ix.INDEXES:
                txn.drop(self.db[t], delete=False)
            for t, k, v in entries:
                txn.put(k, v, db=self.db[t])

        self._write(rebuild)


def open_checked(path: str | Path, config=None, *, readonly: bool = True):
    """The store at ``path`` once ``integrity.problem`` finds nothing; ``DamagedMemory`` otherwise."""
    from spade_async.memory import integrity, swap

    path = Path(path)
    swap.finish(path)  # a repair a kill interrupted: completed first
    if (path / "data.mdb").is_file():
        why = integrity.problem(path)
        if why is not None:
            raise integrity.damaged(path, why)
    return MemoryStore(path, config, readonly=readonly)
