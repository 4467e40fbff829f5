"""LMDB store: records round-trip, indexes agree, map growth, schema checks, writer batching."""

from __future__ import annotations

import anyio
import lmdb
import msgspec
import pytest
from test_memory_helpers import env_source, record

from spade_async.errors import ConfigError
from spade_async.memory import records as R
from spade_async.memory.ops import HintOp, PutOp
from spade_async.memory.store import MemoryConfig, MemoryStore
from spade_async.memory.writer import MemoryWriter


def test_put_get_and_indexes(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        recs = [record(i, skill="A" if i % 2 else "B", valid=i != 3) for i in range(8)]
        results = store.apply([_put(r) for r in recs])
        assert [r.outcome for r in results] == ["new"] * 8
        got = store.get(recs[0].id)
        assert got.source == recs[0].source and got.created_at > 0
        assert store.stats()["total"] == 8 and store.stats()["invalid"] == 1
        assert {r.id for r in store.records(skill="A")} == {r.id for r in recs[1::2]}
        assert [r.id for r in store.records(status="invalid")] == [recs[3].id]
        assert store.resolve(recs[5].id[:10]).id == recs[5].id
        assert store.check_consistency() == []


def test_update_stats_accumulates_and_moves_indexes(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        rec = record(1)
        store.put(rec)
        store.update_stats(rec.id, plays_hint=16, wins_hint=12, plays_nohint=16, wins_nohint=15,
                           regret=0.2, designer_reward=0.5, version=3)
        assert store.count("ctx", b"Logical_Deduction\x00too_easy") == 1
        new = store.update_stats(rec.id, plays_hint=16, wins_hint=14, plays_nohint=16,
                                 wins_nohint=1, regret=0.4, version=5)
        s = new.stats
        assert (s.plays_hint, s.plays_nohint, s.first_version, s.last_version) == (32, 32, 3, 5)
        assert s.win_rate_nohint == pytest.approx(0.5) and s.regret == pytest.approx(0.3)
        assert s.designer_reward == pytest.approx(0.5)
        assert store.count("ctx", b"Logical_Deduction\x00too_easy") == 0
        assert store.count("ctx", b"Logical_Deduction\x00positive") == 1
        assert store.update_stats("0" * 64, plays_hint=1) is None
        assert store.check_consistency() == []


def test_changed_class_thresholds_rebuild_the_index(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        rec = record(1)
        store.put(rec)
        store.update_stats(rec.id, plays_nohint=10, wins_nohint=3, regret=0.1)
        assert store.count("ctx", b"Logical_Deduction\x00positive") == 1
    with MemoryStore(tmp_path / "m", MemoryConfig(positive_low=0.4, too_hard_below=0.35)) as store:
        assert store.count("ctx", b"Logical_Deduction\x00positive") == 0
        assert store.count("ctx", b"Logical_Deduction\x00too_hard") == 1
        assert store.check_consistency() == []


def test_map_grows_on_demand(tmp_path):
    cfg = MemoryConfig(initial_map_mib=1)
    with MemoryStore(tmp_path / "m", cfg) as store:
        for start in range(0, 600, 100):
            store.apply([_put(record(i)) for i in range(start, start + 100)])
        assert store.env.info()["map_size"] > 1 << 20
        assert store.stats()["total"] == 600
        assert store.check_consistency() == []


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "m"
    MemoryStore(path).close()
    env = lmdb.open(str(path), max_dbs=16)
    meta = env.open_db(b"meta")  # (not inside a write txn: LMDB would wait on itself)
    with env.begin(write=True) as txn:
        txn.put(b"schema_version", b"99", db=meta)
    env.close()
    with pytest.raises(ConfigError, match="schema v99.*upgrade spade-async"):
        MemoryStore(path, readonly=True)


def test_newer_record_is_refused():
    rec = record(1)
    newer = msgspec.msgpack.encode(msgspec.to_builtins(rec) | {"schema_version": 7, "new": 1})
    with pytest.raises(ConfigError, match="schema v7"):
        R.decode(newer)
    assert R.decode(R.encode(rec)) == rec


def test_normalised_id_ignores_comments_and_layout():
    src = env_source(4)
    noisy = "# header comment\n\n" + src.replace("\n", "   \n") + "\n\n# trailing\n"
    assert R.env_id(src) == R.env_id(noisy)
    assert R.env_id(src) != R.env_id(env_source(5))
    assert R.env_id("def broken(:\n  pass # x\n") == R.env_id("def broken(:\n\n  pass # x")


def test_writer_batches_concurrent_ops(tmp_path):
    async def main(store):
        writer = MemoryWriter(store)
        results = {}
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            async with anyio.create_task_group() as producers:
                for i in range(120):
                    async def put(i=i):
                        results[i] = await writer.put(record(i))
                    producers.start_soon(put)
            writer.close()
        return writer, results

    with MemoryStore(tmp_path / "m") as store:
        writer, results = anyio.run(main, store)
        assert store.apply([HintOp(env_id=results[0].id, hint="try the corners")])[0].hints == [
            "try the corners"
        ]
        assert len(results) == 120 and all(r.outcome == "new" for r in results.values())
        assert writer.committed == 120 and writer.batches < 120
        assert store.stats()["total"] == 120


def _put(rec):
    return PutOp(record=rec)
