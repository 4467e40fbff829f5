"""Designer-context strategies and PLR replay, served from the indexes."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from test_memory_helpers import record

from spade_async.errors import ConfigError
from spade_async.memory import sampling
from spade_async.memory.ops import PutOp, StatsOp
from spade_async.memory.store import MemoryStore

SKILL = "Logical_Deduction"


@pytest.fixture
def store(tmp_path):
    """30 environments of SKILL with known no-hint win rates and regrets, 5 of another."""
    s = MemoryStore(tmp_path / "m")
    recs = [record(i, skill=SKILL) for i in range(30)] + [
        record(i, skill="Other") for i in range(30, 35)
    ]
    s.apply([PutOp(record=r) for r in recs])
    ops = []
    for i, r in enumerate(recs):
        wins = [8, 16, 0][i % 3] if i < 30 else 8  # positive / too easy / too hard
        ops.append(
            StatsOp(
                env_id=r.id,
                plays_nohint=16,
                wins_nohint=wins,
                plays_hint=16,
                wins_hint=16,
                regret=i / 100,
                version=i,
            )
        )
    s.apply(ops)
    s.recs = recs
    yield s
    s.close()


def test_spade_rule_positives_by_regret_and_named_negative(store):
    ex = sampling.designer_context(store, SKILL, rng=np.random.default_rng(0))
    roles = [e.role for e in ex]
    assert roles[:2] == ["positive", "positive"] and roles[2] in ("too_easy", "too_hard")
    # positives are i % 3 == 0 (win rate 0.5); highest regret first: i = 27, 24
    assert [e.record.id for e in ex[:2]] == [store.recs[27].id, store.recs[24].id]
    assert all(e.record.skill == SKILL for e in ex)
    neg = ex[2].record.stats.win_rate_nohint
    assert (neg > 0.9) if ex[2].role == "too_easy" else (neg < 0.1)
    picks = collections.Counter(
        sampling.designer_context(store, SKILL, rng=np.random.default_rng(k))[2].record.id
        for k in range(60)
    )
    assert len(picks) > 5  # negatives are drawn at random, not always the same one


def test_unknown_skill_and_strategy(store):
    assert sampling.designer_context(store, "Nope") == []
    with pytest.raises(ConfigError, match="strategy 'best'"):
        sampling.designer_context(store, SKILL, strategy="best")


def test_recent_is_newest_first(store):
    ex = sampling.designer_context(store, SKILL, strategy="recent", k=4)
    assert [e.record.id for e in ex] == [store.recs[i].id for i in (29, 28, 27, 26)]
    assert {e.role for e in ex} == {"recent"}


def test_diverse_picks_distinct_spread_examples(store):
    ex = sampling.designer_context(store, SKILL, strategy="diverse", k=3)
    ids = [e.record.id for e in ex]
    assert len(set(ids)) == 3 and ids[0] == store.recs[27].id  # seeded by the best positive


def test_replay_prefers_high_regret_and_stale(store):
    rng = np.random.default_rng(0)
    counts = collections.Counter()
    for _ in range(300):
        counts.update(sampling.replay_sample(store, 2, version=40, rng=rng))
    ids = [r.id for r in store.recs]
    top = max(range(len(ids)), key=lambda i: store.get(ids[i]).stats.regret)
    assert counts.most_common(1)[0][0] == ids[top]
    assert len(counts) > 10  # staleness spreads replay beyond the top of the ranking


def test_replay_marks_reset_staleness(store):
    from spade_async.memory.ops import ReplayOp

    ids = sampling.replay_sample(store, 3, version=50, rng=np.random.default_rng(1))
    assert len(set(ids)) == 3
    assert store.apply([ReplayOp(env_ids=ids, version=50)]) == [3]
    assert all(store.get(i).stats.times_replayed == 1 for i in ids)
    buf = sampling._replay_buffer(store)  # rebuilt after the commit, versions from the index
    last = {row.tobytes().decode(): int(v) for row, v in zip(buf.ids, buf.last, strict=True)}
    assert all(last[i] == 50 for i in ids) and len(last) == 35
    assert store.check_consistency() == []


def test_spade_window_positives_random_from_top_and_window_ages_out(store):
    # window = all 35: SKILL positives are i % 3 == 0 (i = 0..27, regret i/100): the pool is
    # the max(3 * 2, 10) = 10 highest-regret ones (27, 24, ..., 0) and 2 are drawn at random
    pool = {store.recs[i].id for i in range(0, 30, 3)}
    picks = collections.Counter()
    for k in range(40):
        ex = sampling.designer_context(store, SKILL, rng=np.random.default_rng(k), window=35)
        pos = [e.record.id for e in ex if e.role == "positive"]
        assert len(pos) == 2 and set(pos) <= pool
        assert [e.role for e in ex][2] in ("too_easy", "too_hard")
        picks.update(pos)
    assert len(picks) > 4  # not always the same two
    # a window of the 5 newest records (the "Other" skill) holds no SKILL environment
    assert sampling.designer_context(store, SKILL, rng=np.random.default_rng(0), window=5) == []


def test_spade_window_shows_unplayed_environments_from_the_start(tmp_path):
    s = MemoryStore(tmp_path / "m")
    try:
        recs = [record(i, skill=SKILL) for i in range(3)] + [record(9, skill="Other")]
        s.apply([PutOp(record=r) for r in recs])
        ex = sampling.designer_context(s, SKILL, rng=np.random.default_rng(0), window=200)
        assert [e.role for e in ex] == ["seed", "seed"]
        assert {e.record.skill for e in ex} == {SKILL}  # same skill first
        ex = sampling.designer_context(s, "Nope", rng=np.random.default_rng(0), window=200)
        assert len(ex) == 2 and all(e.role == "seed" for e in ex)  # any skill otherwise
    finally:
        s.close()
