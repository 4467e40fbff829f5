"""Environment memory: every environment a run sees, durable and indexed (``memory.lmdb``).

store = open_memory(run_dir)                       # MemoryStore
async with anyio.create_task_group() as tg:        # the controller: one writer task
    writer = MemoryWriter(store)
    await tg.start(writer.run)
    put = await writer.put(make_record(code, origin=Origin(kind="designer", policy_version=v),
                                       valid=True, stage="ok", skill=s, doc_id=doc.id))
    await writer.update_stats(put.id, plays_hint=16, wins_hint=9, plays_nohint=16,
                              wins_nohint=4, regret=0.31, designer_reward=0.7, version=v)
examples = designer_context(store, skill)          # SPADE rule; or strategy="recent"/"diverse"
ids = replay_sample(store, 8, version=v)           # PLR replay for the agent
"""

from __future__ import annotations

from pathlib import Path

from spade_async.memory.ops import HintOp, PutOp, PutResult, ReplayOp, StatsOp
from spade_async.memory.records import EnvRecord, Origin, Stats, env_id, make_record
from spade_async.memory.sampling import Example, designer_context, replay_sample
from spade_async.memory.store import MemoryConfig, MemoryStore
from spade_async.memory.writer import MemoryWriter

__all__ = [
    "EnvRecord",
    "Example",
    "HintOp",
    "MemoryConfig",
    "MemoryStore",
    "MemoryWriter",
    "Origin",
    "PutOp",
    "PutResult",
    "ReplayOp",
    "Stats",
    "StatsOp",
    "designer_context",
    "env_id",
    "make_record",
    "open_memory",
    "replay_sample",
]


def open_memory(
    run_dir: str | Path, config: MemoryConfig | None = None, *, readonly: bool = False
) -> MemoryStore:
    """The memory of the run in ``run_dir`` (``run_dir/memory.lmdb``)."""
    return MemoryStore(Path(run_dir) / "memory.lmdb", config, readonly=readonly)
