"""The one writer: an anyio task that owns every write to the memory.

Producers ``await writer.submit(op)`` (or the helpers) into a bounded stream; the task
drains up to ``max_batch`` ops at a time and commits them in one durable LMDB transaction
on a worker thread, so the event loop never blocks on fsync. ``depth`` is the stream's fill
level, for the dashboard.

    async with anyio.create_task_group() as tg:
        writer = MemoryWriter(store)
        await tg.start(writer.run)
        result = await writer.put(record)
        ...
        writer.close()          # the task drains what is queued, then ends
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from spade_async.memory import ops
from spade_async.memory.records import EnvRecord
from spade_async.memory.store import MemoryStore


class _Pending:
    """One submitted op and the slot its result lands in."""

    __slots__ = ("op", "done", "result", "error")

    def __init__(self, op: ops.Op):
        self.op = op
        self.done = anyio.Event()
        self.result: ops.Result = None
        self.error: BaseException | None = None


class MemoryWriter:
    def __init__(self, store: MemoryStore, *, offload=None):
        self.store = store
        # how blocking work leaves the event loop (default: a worker thread); the simulator
        # passes an inline runner, as its virtual clock does not wait for threads
        self._offload = offload or anyio.to_thread.run_sync
        self._send, self._recv = anyio.create_memory_object_stream[_Pending](
            store.config.queue_size
        )
        self.batches = 0
        self.committed = 0

    @property
    def depth(self) -> int:
        return self._send.statistics().current_buffer_used

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        max_batch = self.store.config.max_batch
        async with self._recv:
            task_status.started()
            async for first in self._recv:
                batch = [first]
                while len(batch) < max_batch:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            results = await self._offload(self.store.apply, [p.op for p in batch])
        except Exception as exc:  # the whole transaction failed: every op in it learns why
            for p in batch:
                p.error = exc
                p.done.set()
            return
        self.batches += 1
        self.committed += len(batch)
        for p, r in zip(batch, results, strict=True):
            p.result = r
            p.done.set()

    def close(self) -> None:
        """No more ops; ``run`` commits what is queued and returns."""
        self._send.close()

    async def submit(self, op: ops.Op) -> ops.Result:
        """Queue ``op`` and wait until its transaction is durable; returns its result."""
        pending = _Pending(op)
        await self._send.send(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    async def put(self, record: EnvRecord, signature: bytes | None = None) -> ops.PutResult:
        if signature is None and record.valid:  # MinHash off the event loop and the writer
            cfg = self.store.config
            signature = await self._offload(
                ops.prepare_signature, record, cfg.num_perm, cfg.shingle_tokens
            )
        return await self.submit(ops.PutOp(record=record, signature=signature))

    async def update_stats(self, env_id: str, **kw) -> EnvRecord | None:
        return await self.submit(ops.StatsOp(env_id=env_id, **kw))

    async def add_hint(self, env_id: str, hint: str) -> EnvRecord | None:
        """Append a generated hint to ``env_id``'s record (None if it is unknown)."""
        return await self.submit(ops.HintOp(env_id=env_id, hint=hint))

    async def quarantine(self, env_id: str, reason: str, step: int) -> EnvRecord | None:
        """Take ``env_id`` out of the sampling pool for good (an audit failed at ``step``)."""
        return await self.submit(ops.QuarantineOp(env_id=env_id, reason=reason, step=step))

    async def mark_replayed(self, env_ids: list[str], version: int) -> int:
        return await self.submit(ops.ReplayOp(env_ids=list(env_ids), version=version))


__all__ = ["MemoryWriter"]
