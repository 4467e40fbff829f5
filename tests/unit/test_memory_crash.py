"""SIGKILL a writing process at random points: the reopened store is consistent and loses
at most the transaction that was not yet committed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from spade_async.memory.store import MemoryConfig, MemoryStore

BATCH = 40
HELPERS = str(Path(__file__).parent)

CHILD = f"""
import sys
sys.path.insert(0, {HELPERS!r})
from test_memory_helpers import record
from spade_async.memory.ops import PutOp, StatsOp
from spade_async.memory.store import MemoryConfig, MemoryStore

store = MemoryStore(sys.argv[1], MemoryConfig(initial_map_mib=1))
batch = store.stats()["total"] // {BATCH}
while True:
    ids = range(batch * {BATCH}, (batch + 1) * {BATCH})
    recs = [record(i, skill="S%d" % (i % 3)) for i in ids]
    ops = [PutOp(record=r) for r in recs]
    ops += [StatsOp(env_id=r.id, plays_nohint=4, wins_nohint=i % 5, plays_hint=4, wins_hint=3,
                    regret=(i % 7) / 10, version=batch) for i, r in zip(ids, recs)]
    store.apply(ops)
    batch += 1
    print(batch, flush=True)
"""


def test_sigkill_mid_write_leaves_a_consistent_store(tmp_path):
    path = tmp_path / "memory.lmdb"
    rng = random.Random(1234)
    for _round in range(4):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                                 text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
        committed = int(child.stdout.readline())  # at least one commit in this round
        time.sleep(rng.uniform(0.0, 0.8))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=30)
        reported = int(out.split()[-1]) if out.split() else committed
        with MemoryStore(path, MemoryConfig(initial_map_mib=1)) as store:
            total = store.stats()["total"]
            # everything reported is durable; at most the one in-flight batch also landed
            assert total in (reported * BATCH, (reported + 1) * BATCH), (total, reported)
            assert store.check_consistency() == []
            for rec in store.records():
                assert rec.stats.plays_nohint == 4  # no batch half-applied
    assert total >= 4 * BATCH
