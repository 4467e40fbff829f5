"""Reading the episode journal after a crash (``journal.py`` writes it; docs/resume.md).

``recover`` reads every segment a run left: a frame cut short at the end of a segment (the
kill landed mid-write) is dropped and counted as torn; a frame whose magic, length, checksum
or payload is wrong is skipped up to the next frame whose checksum holds and counted as
corrupt; reading never raises on the bytes. ``open_journal`` starts the new life's journal
with what the last one left to redo and to train, on disk before the old segments go.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from spade_async.episodes.journal import (
    HEADER,
    MAGIC,
    MAX_PAYLOAD,
    Finished,
    Journal,
    Record,
    Started,
    Trained,
    decoder,
    frame_parts,
    segments,
)
from spade_async.roles.agent import Episode


def read_frames(data: bytes) -> tuple[list[Record], int, int]:
    """Records in ``data`` and how many frames were torn (the last one, cut short by the
    end of the data) and corrupt (a damaged span: bad magic, length, checksum or payload,
    skipped up to the next frame whose checksum holds)."""
    out: list[Record] = []
    torn = corrupt = 0
    pos, n = 0, len(data)
    while pos < n:
        end, short = _frame_end(data, pos)
        if end < 0:
            nxt = _next_frame(data, pos + 1)
            if nxt < 0:
                torn, corrupt = (torn + 1, corrupt) if short else (torn, corrupt + 1)
                break
            corrupt += 1
            pos = nxt
            continue
        try:
            out.append(decoder.decode(data[pos + HEADER.size : end]))
        except (msgspec.DecodeError, msgspec.ValidationError):
            corrupt += 1
        pos = end
    return out, torn, corrupt


def _frame_end(data: bytes, pos: int) -> tuple[int, bool]:
    """(end of the whole frame at ``pos``, -1 if there is none; whether it runs past the
    end of the data: a torn tail)."""
    if len(data) - pos < HEADER.size:
        return -1, True
    magic, length, crc = HEADER.unpack_from(data, pos)
    end = pos + HEADER.size + length
    if magic != MAGIC or length > MAX_PAYLOAD:
        return -1, False
    if end > len(data):
        return -1, True
    if zlib.crc32(data[pos + HEADER.size : end]) != crc:
        return -1, False
    return end, False


def _next_frame(data: bytes, start: int) -> int:
    """The next offset where a whole frame begins (its checksum holds), or -1: the magic
    also occurs inside payloads, so a candidate counts only when its checksum holds."""
    pos = data.find(MAGIC, start)
    while pos >= 0:
        if _frame_end(data, pos)[0] >= 0:
            return pos
        pos = data.find(MAGIC, pos + 1)
    return -1


@dataclass
class Recovery:
    """What a crashed run's journal holds beyond the restored checkpoint ``step``."""

    step: int
    redo: list[Trained] = field(default_factory=list)  # steps after it, in order
    episodes: dict[str, Episode] = field(default_factory=dict)  # redo steps' and pending
    pending: list[str] = field(default_factory=list)  # finished, never consumed (in order)
    lost: dict[str, int] = field(default_factory=dict)  # reason -> episodes (frames: torn)

    def episodes_of(self, t: Trained) -> list[Episode]:
        return [self.episodes[i] for i in t.episodes if i in self.episodes]


def recover(root: Path, step: int) -> Recovery:
    """Read every segment under ``root`` and sort its records against checkpoint ``step``:
    steps after it to redo, finished episodes no step consumed (pending), and what is lost
    (``unfinished``: started, never finished; ``torn``/``corrupt``: frames)."""
    rec = Recovery(step=step)
    started: dict[str, None] = {}
    finished: dict[str, Episode] = {}
    trained: dict[int, Trained] = {}
    dropped: set[str] = set()
    torn = corrupt = 0
    for path in segments(root):
        try:
            data = path.read_bytes()
        except OSError:
            corrupt += 1
            continue
        records, t, c = read_frames(data)
        torn, corrupt = torn + t, corrupt + c
        for r in records:
            if isinstance(r, Started):
                started[r.id] = None
            elif isinstance(r, Finished):
                finished[r.id] = r.episode
            elif isinstance(r, Trained):
                trained[r.step] = r  # a later copy of a step (a resume's rewrite) wins
            else:
                dropped.update(r.ids)
    consumed = {i for t in trained.values() for i in t.episodes}
    rec.redo = [trained[s] for s in sorted(trained) if s > step]
    for t in rec.redo:
        rec.episodes.update((i, finished[i]) for i in t.episodes if i in finished)
    for i, ep in finished.items():
        if i not in consumed and i not in dropped:
            rec.pending.append(i)
            rec.episodes[i] = ep
    rec.lost = {
        "unfinished": sum(1 for i in started if i not in finished and i not in dropped),
        "torn": torn,
        "corrupt": corrupt,
    }
    return rec


def split_by_version(
    episodes: Sequence[Episode], version: int, max_staleness: int
) -> tuple[list[Episode], list[Episode], list[Episode]]:
    """(usable, stale, ahead) against the restored trainer's ``version``: usable when
    ``0 <= version - episode version <= max_staleness``; ahead: from a version the restored
    trainer has not reached (its weights are gone: the steps that made it were not redone)."""
    ok, stale, ahead = [], [], []
    for ep in episodes:
        age = version - ep.version
        if ep.version < 0:  # no turn generated: nothing to train, its outcome still scores
            ok.append(ep)
        else:
            (ok if 0 <= age <= max_staleness else stale if age > 0 else ahead).append(ep)
    return ok, stale, ahead


def by_group(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """Episodes as the async schedule's groups (one environment at one policy snapshot),
    oldest version first, so the trainer takes them before they age out of the bound."""
    groups: dict[tuple[int, str], list[Episode]] = defaultdict(list)
    for ep in episodes:
        if ep.version >= 0:
            groups[(ep.version, ep.env_id)].append(ep)
    for ep in episodes:  # no turn: rides with its environment's newest group
        if ep.version < 0:
            keys = [k for k in groups if k[1] == ep.env_id]
            groups[max(keys) if keys else (-1, ep.env_id)].append(ep)
    return [groups[k] for k in sorted(groups)]


def open_journal(root: Path, restored_step: int | None) -> tuple[Journal, Recovery | None]:
    """This life's journal, after sorting out what a previous life left (``recover``
    against ``restored_step``, 0 without a checkpoint): the steps to redo and the pending
    episodes are copied into the new first segment (fsync'd) before the old segments are
    deleted, so a kill at any point of a resume leaves every one of them on disk."""
    old = segments(root)
    rec = recover(root, restored_step or 0) if old else None
    journal = Journal(root)
    if rec is None:
        return journal, None
    carried: list[bytes] = []
    for t in rec.redo:
        for jid in t.episodes:
            if jid in rec.episodes:
                carried += frame_parts(Finished(id=jid, episode=rec.episodes[jid]))
        carried += frame_parts(t)
    for j in rec.pending:
        carried += frame_parts(Finished(id=j, episode=rec.episodes[j]))
    try:
        journal._write_sync(carried, sync=True)
    except OSError as exc:  # the old segments stay: the next resume reads them again
        journal._fail(exc)
        return journal, rec
    for t in rec.redo:
        journal._steps[journal.segment] = max(journal._steps[journal.segment], t.step)
        for jid in t.episodes:
            journal._consumed[jid] = t.step
            journal._track(jid)
    for jid in rec.pending:
        journal.adopt(jid, rec.episodes[jid])
    for seg in old:
        seg.unlink(missing_ok=True)
    return journal, rec
