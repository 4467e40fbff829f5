"""The episode journal (spade_async/episodes/journal.py): framing, torn tails, checksums,
settling at checkpoints, the resume's version filter and its counts by reason."""

from __future__ import annotations

import anyio
import pytest

from spade_async.episodes import journal as jr
from spade_async.episodes import recovery as rc
from spade_async.loop.resume import summary
from spade_async.roles.agent import Episode
from spade_async.trainer.batch import Sample


def _ep(env: str = "e1", version: int = 3, reward: float = 1.0, n: int = 4) -> Episode:
    return Episode(
        env_id=env,
        seed=7,
        hinted=False,
        token_ids=list(range(n)),
        loss_mask=[0, 1] * (n // 2),
        logprobs=[-0.5] * n,
        turn_spans=[(1, n)] if version >= 0 else [],
        turn_versions=[version] if version >= 0 else [],
        reward=reward,
        status="terminated",
        turns=1,
        messages=[{"role": "user", "content": "SPJ1 in a message"}],
    )


def _sample(version: int = 3) -> Sample:
    return Sample(
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        advantage=0.5,
        rollout_logprobs=[0.0, -0.25, -1.5],
        policy_version=version,
    )


def _life(root, steps: int, pending: int = 2, unfinished: int = 1) -> list[Episode]:
    """One run life: ``steps`` trained steps of two episodes each, ``pending`` finished
    episodes no step took, ``unfinished`` started ones; no checkpoint."""
    j = jr.Journal(root)
    eps: list[Episode] = []

    async def go() -> None:
        for step in range(1, steps + 1):
            batch = []
            for k in range(2):
                ep = _ep(f"e{k}", version=step - 1)
                await j.finished(j.started(), ep)
                batch.append(ep)
            await j.trained(step, step - 1, batch, [_sample(step - 1)], 2.0)
            eps.extend(batch)
        for _ in range(pending):
            ep = _ep("p", version=steps)
            await j.finished(j.started(), ep)
            eps.append(ep)
        for _ in range(unfinished):
            j.started()

    anyio.run(go)
    j.close()
    return eps


def test_a_life_is_read_back_whole(tmp_path):
    eps = _life(tmp_path, steps=3)
    rec = rc.recover(tmp_path, step=1)
    assert [t.step for t in rec.redo] == [2, 3]  # step 1 is in the checkpoint
    assert rec.redo[0].samples == [_sample(1)] and rec.redo[0].normaliser == 2.0
    assert rec.episodes_of(rec.redo[1]) == eps[4:6]
    assert [rec.episodes[i] for i in rec.pending] == eps[6:]
    assert rec.lost == {"unfinished": 1, "torn": 0, "corrupt": 0}


def test_a_torn_tail_is_dropped_and_counted(tmp_path):
    _life(tmp_path, steps=2, pending=2, unfinished=0)
    seg = jr.segments(tmp_path)[0]
    whole = seg.read_bytes()
    for cut in (3, jr.HEADER.size + 5, 40):  # inside the last frame's header or payload
        seg.write_bytes(whole[:-cut] if cut != 3 else whole + b"SPJ")
        rec = rc.recover(tmp_path, step=0)
        assert rec.lost["torn"] == 1 and rec.lost["corrupt"] == 0
        assert len(rec.redo) == 2
        assert len(rec.pending) == (2 if cut == 3 else 1)  # the cut frame is the last one


def test_a_bad_checksum_skips_one_frame_and_reading_goes_on(tmp_path):
    _life(tmp_path, steps=2, pending=1, unfinished=0)
    seg = jr.segments(tmp_path)[0]
    data = bytearray(seg.read_bytes())
    records, _, _ = rc.read_frames(bytes(data))
    # the first frame is a Started record; change one letter of the second (a Finished):
    # it still decodes, only its checksum tells
    first = jr.HEADER.size + jr.HEADER.unpack_from(data, 0)[1]
    at = data.index(b"in a message", first)
    assert at < first + jr.HEADER.size + jr.HEADER.unpack_from(data, first)[1]
    data[at] = ord("o")
    seg.write_bytes(bytes(data))
    again, torn, corrupt = rc.read_frames(bytes(data))
    assert (torn, corrupt) == (0, 1) and len(again) == len(records) - 1
    rec = rc.recover(tmp_path, step=0)
    assert rec.lost["corrupt"] == 1 and [t.step for t in rec.redo] == [1, 2]


@pytest.mark.parametrize(
    "data", [b"", b"\x00" * 3, b"garbage" * 100, jr.MAGIC + b"\xff\xff\xff\x7f" + b"\x00" * 8]
)
def test_garbage_never_raises(data):
    records, torn, corrupt = rc.read_frames(data)
    assert records == [] and torn + corrupt == (1 if data else 0)


def test_checkpoint_settles_and_deletes_segments(tmp_path):
    j = jr.Journal(tmp_path)

    async def go() -> None:
        a, b, late = _ep(version=0), _ep(version=0), _ep(version=1)
        for ep in (a, b):
            await j.finished(j.started(), ep)
        await j.trained(1, 0, [a, b], [_sample(0)], 2.0)
        await j.finished(j.started(), late)  # finished, not consumed at the checkpoint
        first = j.segment
        await j.checkpointed(1)
        assert first.exists()  # ``late`` keeps it
        await j.trained(2, 1, [late], [_sample(1)], 1.0)
        await j.checkpointed(2)
        assert not first.exists() and jr.segments(tmp_path) == [j.segment]

    anyio.run(go)
    j.close()
    rec = rc.recover(tmp_path, step=2)
    assert rec.redo == [] and rec.pending == [] and rec.lost["unfinished"] == 0


def test_dropped_episodes_are_not_given_back(tmp_path):
    j = jr.Journal(tmp_path)
    stale, kept = _ep(version=0), _ep(version=1)

    async def go() -> None:
        for ep in (stale, kept):
            await j.finished(j.started(), ep)

    anyio.run(go)
    assert j.dropped([stale], "stale") == 0  # not one a resume gave back
    j.close()
    rec = rc.recover(tmp_path, step=0)
    assert [rec.episodes[i] for i in rec.pending] == [kept]


def test_open_journal_carries_redo_and_pending_into_one_new_segment(tmp_path):
    eps = _life(tmp_path, steps=3, pending=2, unfinished=2)
    old = jr.segments(tmp_path)
    j, rec = rc.open_journal(tmp_path, 1)
    assert rec is not None and rec.lost["unfinished"] == 2
    assert not any(p.exists() for p in old) and jr.segments(tmp_path) == [j.segment]
    j.close()
    again = rc.recover(tmp_path, step=1)  # a kill right after the rewrite: the same work
    assert [t.step for t in again.redo] == [2, 3]
    assert [again.episodes[i] for i in again.pending] == eps[6:]
    assert again.lost["unfinished"] == 0  # counted once, by the resume that found them


def test_requeued_episodes_are_counted_when_trained_or_dropped(tmp_path):
    _life(tmp_path, steps=1, pending=3, unfinished=0)
    j, rec = rc.open_journal(tmp_path, 1)
    back = [rec.episodes[i] for i in rec.pending]

    async def go() -> int:
        return await j.trained(2, 1, back[:2], [], 2.0)

    assert anyio.run(go) == 2
    assert j.dropped(back[2:], "stale") == 1
    j.close()


def test_version_filter_against_the_restored_policy():
    eps = [_ep(version=v) for v in (2, 3, 4, 5, 6)] + [_ep(version=-1)]
    ok, stale, ahead = rc.split_by_version(eps, version=5, max_staleness=1)
    assert [e.version for e in ok] == [4, 5, -1]
    assert [e.version for e in stale] == [2, 3] and [e.version for e in ahead] == [6]
    ok, stale, ahead = rc.split_by_version(eps[:5], version=5, max_staleness=0)
    assert [e.version for e in ok] == [5] and len(stale) == 3 and len(ahead) == 1


def test_groups_oldest_first_and_turnless_episodes_ride_along():
    eps = [_ep("b", 4), _ep("a", 3), _ep("b", 3), _ep("a", -1), _ep("a", 3)]
    groups = rc.by_group(eps)
    assert [[(e.env_id, e.version) for e in g] for g in groups] == [
        [("a", 3), ("a", 3), ("a", -1)],
        [("b", 3)],
        [("b", 4)],
    ]


def test_summary_names_every_reason_with_a_count():
    line = summary(2, 5, 3, {"unfinished": 4, "torn": 1, "corrupt": 0, "stale": 0}, 7)
    assert line == (
        "journal: 2 step(s) redone (5 episodes), 3 finished episode(s) back in training at "
        "policy version 7; lost: 4 unfinished, 1 torn"
    )
    assert summary(0, 0, 0, {"torn": 0}, 0).endswith("lost: none")


def test_a_failed_write_stops_the_journal_not_the_run(tmp_path):
    j = jr.Journal(tmp_path)
    import os

    os.close(j._fd)  # every write now fails (EBADF), as a full disk would
    j._fd = os.open(tmp_path / "read-only", os.O_RDONLY | os.O_CREAT)

    async def go() -> None:
        jid = j.started()
        await j.finished(jid, _ep())
        await j.trained(1, 0, [], [_sample(0)], 1.0)
        await j.checkpointed(1)

    anyio.run(go)
    assert j.broken.startswith("OSError")
    j.close()
