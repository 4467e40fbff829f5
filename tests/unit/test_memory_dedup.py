"""Exact and near-duplicate detection (MinHash LSH bands persisted in LMDB)."""

from __future__ import annotations

import pytest
from test_memory_helpers import env_source, record

from spade_async.errors import ConfigError
from spade_async.memory.store import MemoryConfig, MemoryStore


def _near_copy(src: str) -> str:
    """The same environment with one attribute renamed and one constant changed."""
    return src.replace("def step", "def step", 1).replace("'puzzle", "'riddle", 1) + "\nX = 1\n"


def test_exact_duplicate_is_counted_not_stored_twice(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        first = store.put(record(1))
        again = store.put(record(1, source="# a comment\n" + env_source(1) + "\n\n"))
        assert (first.outcome, again.outcome) == ("new", "exact_duplicate")
        assert again.id == first.id
        st = store.stats()
        assert st["total"] == 1 and st["exact_repeats"] == 1
        assert store.get(first.id).exact_repeats == 1


def test_near_duplicate_links_to_its_twin(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        base = store.put(record(7))
        for i in range(20):  # unrelated environments do not match
            assert store.put(record(100 + i)).outcome == "new"
        copy = store.put(record(8, source=_near_copy(env_source(7))))
        assert copy.outcome == "near_duplicate" and copy.duplicate_of == base.id
        assert copy.similarity >= 0.85
        stored = store.get(copy.id)
        assert stored.status == "duplicate" and stored.duplicate_of == base.id
        assert store.get(base.id).near_copies == 1
        assert store.stats()["duplicates"] == 1
        assert store.check_consistency() == []


def test_threshold_is_configurable(tmp_path):
    heavy = env_source(7).replace("self.", "self.s_")  # every line touched
    with MemoryStore(tmp_path / "strict", MemoryConfig(near_dup_threshold=0.95)) as store:
        store.put(record(7))
        assert store.put(record(8, source=heavy)).outcome == "new"
    with MemoryStore(tmp_path / "loose", MemoryConfig(near_dup_threshold=0.3)) as store:
        store.put(record(7))
        assert store.put(record(8, source=heavy)).outcome == "near_duplicate"
    with pytest.raises(ConfigError, match="near_dup_threshold=0.999"):
        MemoryStore(tmp_path / "bad", MemoryConfig(near_dup_threshold=0.999))


def test_invalid_records_skip_near_dedup(tmp_path):
    with MemoryStore(tmp_path / "m") as store:
        store.put(record(7))
        bad = store.put(record(8, source=_near_copy(env_source(7)), valid=False))
        assert bad.outcome == "new" and store.get(bad.id).status == "invalid"
