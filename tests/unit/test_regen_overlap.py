"""``pipeline.regen_overlap`` (loop/schedule_async.producer): with it, the next window is
designed in the background while groups of the current window's environments keep being
admitted (carried rounds, within the same staleness admission); without it, no group starts
until the designer's batch is back. Either way the new window's first round is fresh (its
hinted plays) and every group's admission is the staleness bound's."""

from __future__ import annotations

import types
from collections import Counter

import anyio
import msgspec
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


class _Meters:
    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n


def _setup(monkeypatch, overlap: bool):
    from spade_async.loop import cycle
    from spade_async.recipe import Config

    cfg = Config()
    cfg = msgspec.structs.replace(
        cfg,
        max_staleness=1,
        replay_envs=0,
        designer_enabled=True,
        regen_interval=1,
        pipeline=msgspec.structs.replace(cfg.pipeline, regen_overlap=overlap),
    )
    designed: list[int] = []  # the version each regeneration started at
    gate = anyio.Event()  # the second window's designer is slow: it waits for this
    played: list[str] = []
    fresh_hints: list[list[str]] = []

    async def regenerate(rt, version):
        n = len(designed)
        designed.append(version)
        if n == 1:
            await gate.wait()
        return [types.SimpleNamespace(env_id=f"w{n}-e{i}") for i in range(2)]

    async def hints(rt, window, refs, *, fresh):
        if fresh:
            fresh_hints.append([r.env_id for r in refs])
        return {}

    async def play(rt, refs, hints, version, n):
        played.append(refs[0].env_id)
        return []

    monkeypatch.setattr(cycle, "regenerate", regenerate)
    monkeypatch.setattr(cycle, "env_refs", lambda rt, ids: [types.SimpleNamespace(env_id=i)
                                                            for i in ids])  # fmt: skip
    monkeypatch.setattr(cycle, "window_hints", hints)
    monkeypatch.setattr(cycle, "play", play)
    monkeypatch.setattr(cycle, "plays_per_env", lambda cfg, n: 1)
    rt = types.SimpleNamespace(cfg=cfg, state=types.SimpleNamespace(version=0, current_envs=[]),
                               meters=_Meters())  # fmt: skip
    return rt, designed, gate, played, fresh_hints


@pytest.mark.parametrize("overlap", [True, False])
async def test_the_engines_play_the_current_window_while_the_next_is_designed(monkeypatch, overlap):
    from spade_async.loop import schedule_async

    rt, designed, gate, played, fresh_hints = _setup(monkeypatch, overlap)
    sh = schedule_async.Shared(1)
    send, recv = anyio.create_memory_object_stream(64)
    stop = anyio.Event()
    async with recv, anyio.create_task_group() as tg:
        tg.start_soon(schedule_async.producer, rt, sh, send, stop)
        await anyio.wait_all_tasks_blocked()
        # window 0: (0 steps + 1 + max_staleness 1) x 2 groups admitted, then admission waits
        assert designed == [0] and played == ["w0-e0", "w0-e1"] * 2
        rt.state.version = 1  # a step: the window (regen_interval 1) is over
        sh.admission.notify(stepped=True)
        await anyio.wait_all_tasks_blocked()
        # the round admission held back finishes; then the next window's design starts
        assert played[4:] == ["w0-e0", "w0-e1"] and designed == [0, 1]
        rt.state.version = 2  # another step while the designer is still generating
        sh.admission.notify(stepped=True)
        await anyio.wait_all_tasks_blocked()
        if overlap:  # the step's 2 new slots went to the current window's environments
            assert played[6:] == ["w0-e0", "w0-e1"]
            assert rt.meters.counts["pipeline/carried_groups"] == 2
        else:  # nothing started while the designer generates
            assert played[6:] == []
            assert rt.meters.counts["pipeline/carried_groups"] == 0
        gate.set()  # the design is back
        rt.state.version = 3
        sh.admission.notify(stepped=True)
        await anyio.wait_all_tasks_blocked()
        stop.set()
        tg.cancel_scope.cancel()
    # the new window is installed, its first round fresh (hinted plays), and played
    assert fresh_hints == [["w0-e0", "w0-e1"], ["w1-e0", "w1-e1"]]
    assert sh.window_start >= 2 and rt.state.current_envs == ["w1-e0", "w1-e1"]
    new = [p for p in played if p.startswith("w1")]
    assert new and played[-len(new) :] == new  # no old-window group after the new window's
    # admission is the staleness bound's in both modes: started <= (steps + 1 + 1) x 2
    assert len(played) <= (3 + 1 + 1) * 2


async def test_nothing_left_to_carry_waits_for_the_design_without_empty_rounds(monkeypatch):
    """Every environment of the current window gone (quarantined, invalid) while the next is
    designed: the producer waits for the design instead of sending empty rounds, which
    would end the consumer's steps early."""
    from spade_async.loop import cycle, schedule_async

    rt, designed, gate, played, fresh_hints = _setup(monkeypatch, True)
    gone: set[str] = set()
    monkeypatch.setattr(cycle, "env_refs", lambda rt, ids: [types.SimpleNamespace(env_id=i)
                                                            for i in ids if i not in gone])  # fmt: skip
    sh = schedule_async.Shared(1)
    send, recv = anyio.create_memory_object_stream(64)
    stop = anyio.Event()
    got = []
    async with recv, anyio.create_task_group() as tg:
        tg.start_soon(schedule_async.producer, rt, sh, send, stop)
        await anyio.wait_all_tasks_blocked()
        gone.update({"w0-e0", "w0-e1"})
        rt.state.version = 1
        sh.admission.notify(stepped=True)
        await anyio.wait_all_tasks_blocked()
        assert designed == [0, 1]
        while True:  # what reached the stream so far
            try:
                got.append(recv.receive_nowait())
            except anyio.WouldBlock:
                break
        assert all(g.env is not None for g in got), "an empty round while the design was pending"
        gate.set()
        rt.state.version = 2  # a step: admission lets the new window's groups start
        sh.admission.notify(stepped=True)
        await anyio.wait_all_tasks_blocked()
        stop.set()
        tg.cancel_scope.cancel()
    assert played[-1].startswith("w1")  # the new window played once the design was back
