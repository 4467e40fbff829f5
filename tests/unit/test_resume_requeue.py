"""A resume's pending episodes in the async consumer (loop/schedule_async.consumer with
loop/resume.due_now): taken before the stream, oldest first, and a group that would be past
max_staleness one step later goes into the current step, so none is dropped as stale."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from spade_async.episodes import recovery as rc
from spade_async.loop import cycle, schedule_async
from spade_async.loop.resume import due_now
from spade_async.roles.agent import EnvRef, Episode
from spade_async.telemetry.metrics import Meters

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def _ep(env: str, version: int) -> Episode:
    return Episode(
        env_id=env,
        seed=1,
        hinted=False,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        turn_spans=[(1, 2)],
        turn_versions=[version],
        reward=1.0,
        status="terminated",
        turns=1,
        messages=[],
    )


def _rt(version: int, max_staleness: int, max_steps: int):
    cfg = SimpleNamespace(
        max_steps=max_steps,
        max_staleness=max_staleness,
        regen_interval=4,
        pipeline=SimpleNamespace(queue_groups=4),
        memory=SimpleNamespace(queue_size=8),
    )
    state = SimpleNamespace(step=0, version=version)
    return SimpleNamespace(
        cfg=cfg, state=state, meters=Meters(), writer=SimpleNamespace(depth=0), journal=None
    )


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_resumed_groups_all_train_within_the_bound(monkeypatch, max_staleness):
    version = 10
    # more of the oldest version than one step takes: the surplus would go stale next step
    versions = [version - max_staleness] * 3 + [version] * 2
    eps = [_ep(f"e{i}", v) for i, v in enumerate(versions)]
    resumed = [schedule_async.Group(EnvRef(g[0].env_id, ""), g) for g in rc.by_group(reversed(eps))]
    assert [g.version for g in resumed] == sorted(versions)  # oldest first
    rt = _rt(version, max_staleness, max_steps=len(versions))
    taken: list[list[tuple[int, int]]] = []  # per step: (trainer version, group version)

    async def learn(rt, episodes, window, **kw) -> None:
        taken.append([(rt.state.version, e.version) for e in episodes])
        rt.state.step += 1
        rt.state.version += 1

    monkeypatch.setattr(cycle, "learn", learn)
    sh = schedule_async.Shared(max_staleness)
    sh.envs_per_step = 1  # one group a step, as before the producer sized the round
    send, recv = anyio.create_memory_object_stream[schedule_async.Group](len(versions))
    async with send, recv:
        for _ in range(len(versions)):  # the stream's own groups, behind the resumed ones
            fresh = schedule_async.Group(EnvRef("fresh", ""), [_ep("fresh", version + 9)])
            await send.send(fresh)
        await schedule_async.consumer(rt, sh, recv, anyio.Event(), resumed)
    got = [pair for step in taken for pair in step if pair[1] < version + 9]
    assert sorted(v for _, v in got) == sorted(versions)  # every resumed episode trained
    assert all(0 <= tv - v <= max_staleness for tv, v in got)
    assert rt.meters.counters.get("staleness/dropped", 0) == 0
    # the first step takes every group that would be too old for the second
    assert len(taken[0]) == sum(version + 1 - v > max_staleness for v in versions) >= 3


def test_due_now_only_for_a_group_that_would_age_out():
    g = SimpleNamespace(version=4)
    assert due_now([g], version=5, max_staleness=1)  # 6 - 4 > 1 at the next step
    assert not due_now([g], version=4, max_staleness=1)
    assert not due_now([], version=9, max_staleness=0)
