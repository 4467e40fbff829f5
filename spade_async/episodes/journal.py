"""``RUN_DIR/episodes-pending/``: finished episodes, durable until trained and checkpointed.

An append-only journal in numbered segments (``seg-000001.log``, ...). Each record is one
frame: ``b"SPJ1"``, the payload's length and its CRC-32 (little-endian u32 each), then the
payload (msgpack of one of the record types below). Four records:

- ``Started``: an agent episode began (written, not fsync'd: it survives a kill -9 in the
  page cache and tells a resume how many episodes were in flight);
- ``Finished``: the whole ``Episode`` (tokens, loss mask, rollout log-probs, per-turn
  policy versions), fsync'd before the episode reaches the consumer;
- ``Trained``: a trainer step's exact batch (samples with their advantages and rollout
  log-probs, designer samples included, and the loss normaliser) and the ids of every
  episode the step consumed, fsync'd before the trainer takes it;
- ``Dropped``: episodes the consumer dropped (stale), never to be trained.

At each checkpoint a new segment starts and a segment whose records are all settled
(finished episodes consumed by a checkpointed step or dropped, trained steps checkpointed,
started episodes finished) is deleted. ``recover`` reads a run's segments after a crash: a
frame cut short at the end of a segment (the kill landed mid-write) is dropped and counted
as torn, a frame whose checksum or payload is wrong is skipped and counted as corrupt; the
reader never raises on the bytes. The loop's side of a resume is ``loop/resume.py``.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
import zlib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from spade_async.roles.agent import Episode
from spade_async.trainer.batch import Sample

DIR_NAME = "episodes-pending"
MAGIC = b"SPJ1"
HEADER = struct.Struct("<4sII")  # magic, payload length, crc32(payload)
MAX_PAYLOAD = 1 << 31  # a longer length is damage, not a record
_SEGMENT = re.compile(r"seg-(\d{6,})\.log")


class Started(msgspec.Struct, tag="started"):
    id: str


class Finished(msgspec.Struct, tag="finished"):
    id: str
    episode: Episode


class Trained(msgspec.Struct, tag="trained"):
    step: int  # the trainer step this batch made (steps done after it)
    version: int  # the trainer's policy version when it took the batch
    episodes: list[str]  # every episode the step consumed (trained or filtered out)
    samples: list[Sample]
    normaliser: float


class Dropped(msgspec.Struct, tag="dropped"):
    ids: list[str]
    reason: str


Record = Started | Finished | Trained | Dropped
_encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(Record)


def frame(record: Record) -> bytes:
    return b"".join(frame_parts(record))


def frame_parts(record: Record) -> list[bytes]:
    """The frame as (header, payload): written with one writev, never copied whole."""
    payload = _encoder.encode(record)
    return [HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)), payload]


def segments(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _SEGMENT.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


class Journal:
    """The writing side, one per run life (see the module docstring). Every method is
    called from the event loop; durable appends fsync in a worker thread, in groups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.life = uuid.uuid4().hex[:8]
        self._seq = 0
        self._buf: list[bytes] = []
        self._queued = self._written = 0
        self._flushing = False
        self._flushed = anyio.Event()
        self.broken = ""  # the write error that stopped the journal ("" while it works)
        self.reported = False  # the loop said so (one event)
        self._ids: dict[int, str] = {}  # id(Episode) -> its journal id, until consumed
        self._live: dict[Path, set[str]] = defaultdict(set)  # segment -> unsettled ids
        self._steps: dict[Path, int] = defaultdict(int)  # segment -> latest step trained
        self._where: dict[str, Path] = {}  # unsettled id -> its segment
        self._consumed: dict[str, int] = {}  # id -> step that consumed it
        self.requeued: set[str] = set()  # ids a resume gave back to training
        root.mkdir(parents=True, exist_ok=True)
        old = segments(root)
        self._number = int(_SEGMENT.fullmatch(old[-1].name).group(1)) if old else 0
        self._fd = -1
        self._open_next()

    # -- files ---------------------------------------------------------------------
    def _open_next(self) -> None:
        self._number += 1
        self.segment = self.root / f"seg-{self._number:06d}.log"
        self._fd = os.open(self.segment, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fsync_dir(self.root)

    def close(self) -> None:
        if self._fd >= 0:
            if self._buf and not self.broken:
                self._write_sync(self._buf, sync=True)
                self._buf = []
            os.close(self._fd)
            self._fd = -1

    def _write_sync(self, parts: list[bytes], *, sync: bool) -> None:
        for i in range(0, len(parts), 512):  # IOV_MAX is 1024 on Linux
            chunk = parts[i : i + 512]
            done = os.writev(self._fd, chunk)
            if done < sum(map(len, chunk)):  # a short write: the rest, byte by byte
                view = memoryview(b"".join(chunk))[done:]
                while view:
                    view = view[os.write(self._fd, view) :]
        if sync:
            os.fsync(self._fd)

    def _fail(self, exc: OSError) -> None:
        self.broken = f"{type(exc).__name__}: {exc}"
        self._buf = []

    def _soon(self, parts: list[bytes]) -> None:
        """Append without waiting for the disk (a kill -9 keeps it: the page cache)."""
        if self.broken:
            return
        if self._flushing:
            self._buf += parts
            self._queued += 1
            return
        try:
            self._write_sync(parts, sync=False)
        except OSError as exc:
            self._fail(exc)

    async def _durable(self, parts: list[bytes]) -> None:
        """Append and return once it is on disk (fsync), grouped with concurrent appends."""
        if self.broken:
            return
        self._buf += parts
        self._queued += 1
        target = self._queued
        while self._written < target and not self.broken:
            if self._flushing:
                await self._flushed.wait()
                continue
            self._flushing = True
            try:
                while self._buf and not self.broken:
                    batch, self._buf, upto = self._buf, [], self._queued
                    with anyio.CancelScope(shield=True):  # never cut a write in half
                        try:
                            await anyio.to_thread.run_sync(
                                lambda b=batch: self._write_sync(b, sync=True)
                            )
                        except OSError as exc:
                            self._fail(exc)
                    self._written = upto
            finally:
                self._flushing = False
                self._written = max(self._written, self._queued) if self.broken else self._written
                done, self._flushed = self._flushed, anyio.Event()
                done.set()

    async def _idle(self) -> None:
        while self._flushing:
            await self._flushed.wait()

    # -- records -------------------------------------------------------------------
    def started(self) -> str:
        self._seq += 1
        jid = f"{self.life}-{self._seq}"
        self._track(jid)
        self._soon(frame_parts(Started(id=jid)))
        return jid

    async def finished(self, jid: str, ep: Episode) -> None:
        self._settle(jid)  # its Started record no longer keeps its segment
        self._track(jid)
        self._ids[id(ep)] = jid
        await self._durable(frame_parts(Finished(id=jid, episode=ep)))

    def adopt(self, jid: str, ep: Episode, *, requeued: bool = True) -> None:
        """An episode a resume carried into this life's first segment."""
        self._track(jid)
        self._ids[id(ep)] = jid
        if requeued:
            self.requeued.add(jid)

    async def trained(
        self, step: int, version: int, consumed: Sequence[Episode], samples, normaliser: float
    ) -> int:
        """Record a step's batch before the trainer takes it; returns how many of the
        consumed episodes a resume had given back."""
        ids = [j for ep in consumed if (j := self._ids.pop(id(ep), None)) is not None]
        for j in ids:
            self._consumed[j] = step
        self._steps[self.segment] = max(self._steps[self.segment], step)
        rec = Trained(
            step=step, version=version, episodes=ids, samples=list(samples), normaliser=normaliser
        )
        await self._durable(frame_parts(rec))
        return sum(j in self.requeued for j in ids)

    def dropped(self, episodes: Sequence[Episode], reason: str) -> int:
        """Episodes never to be trained; returns how many a resume had given back."""
        ids = [j for ep in episodes if (j := self._ids.pop(id(ep), None)) is not None]
        for j in ids:
            self._settle(j)
        if ids:
            self._soon(frame_parts(Dropped(ids=ids, reason=reason)))
        return sum(j in self.requeued for j in ids)

    async def checkpointed(self, step: int) -> None:
        """Steps up to ``step`` are in a checkpoint: their episodes are settled. A new
        segment starts; the old ones with nothing unsettled are deleted."""
        for j in [j for j, s in self._consumed.items() if s <= step]:
            del self._consumed[j]
            self._settle(j)
        await self._idle()
        if self.broken:
            return
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._open_next()
            for seg in segments(self.root):
                if seg != self.segment and not self._live.get(seg) and self._steps[seg] <= step:
                    seg.unlink(missing_ok=True)
                    self._live.pop(seg, None)
                    self._steps.pop(seg, None)
        except OSError as exc:
            self._fail(exc)

    def _track(self, jid: str) -> None:
        self._where[jid] = self.segment
        self._live[self.segment].add(jid)

    def _settle(self, jid: str) -> None:
        seg = self._where.pop(jid, None)
        if seg is not None:
            self._live[seg].discard(jid)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- the loop's hooks (``rt``: the loop's Runtime; a runtime without a journal: no-ops) ----
def note_started(rt) -> str:
    j = getattr(rt, "journal", None)
    return j.started() if j is not None else ""


async def note_finished(rt, jid: str, ep: Episode) -> None:
    j = getattr(rt, "journal", None)
    if j is not None and jid:
        await j.finished(jid, ep)


async def note_trained(rt, consumed: Sequence[Episode], samples, normaliser: float) -> None:
    """Before the trainer takes step ``rt.state.step + 1``: its batch, on disk."""
    j = getattr(rt, "journal", None)
    if j is None:
        return
    back = await j.trained(rt.state.step + 1, rt.state.version, consumed, samples, normaliser)
    rt.meters.count("resume/requeued_trained", back)
    if j.broken and not j.reported:  # training goes on; a resume would lose these steps
        j.reported = True
        rt.meters.count("resume/journal_errors")
        rt.tel.event(
            rt.state.step,
            f"episode journal {j.root} stopped ({j.broken}): a resume loses the episodes "
            "finished since the last checkpoint; free space there for the next run",
            level="warn",
        )


def note_dropped(rt, episodes: Sequence[Episode], reason: str) -> None:
    j = getattr(rt, "journal", None)
    if j is not None:
        rt.meters.count(f"resume/lost/{reason}", j.dropped(episodes, reason))
