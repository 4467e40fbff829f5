"""The async producer's admission rule (loop/schedule_async.Admission): a group starts only
while started - dropped < (steps + 1 + max_staleness) x groups per step, so that groups
consumed in order are never more than max_staleness versions old, while the next step's
groups may start before the previous step's are handed over."""

from __future__ import annotations

import anyio
import pytest

from spade_async.loop.schedule_async import Admission

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("staleness", [0, 1, 2])
async def test_admission_keeps_in_order_groups_within_staleness(staleness):
    """Producer admits groups tagged with the version at start; the consumer takes G per
    step in order and trains (version + 1). No taken group is older than the bound, and
    the producer is exactly (1 + staleness) steps ahead before each step."""
    G, steps = 3, 6
    adm = Admission(staleness)
    version = 0
    made: list[int] = []  # version at start of each admitted group, in order
    for_step: list[int] = []  # the step admission says each group is for (its priority)
    ahead: list[int] = []
    ages: list[int] = []

    async def producer() -> None:
        while True:
            for_step.append(await adm.admit(lambda: G))
            made.append(version)

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        for step in range(steps):
            await anyio.sleep(0.01)  # the producer runs until admission stops it
            ahead.append(len(made) - step * G)
            taken = made[step * G : (step + 1) * G]
            ages += [version - v for v in taken]
            version += 1
            adm.notify(stepped=True)
        tg.cancel_scope.cancel()
    assert ahead == [(1 + staleness) * G] * steps
    assert max(ages) == staleness  # as stale as allowed, never more
    # consumed in order, group k goes into step k // G: the step its requests are ranked by
    assert for_step == [k // G for k in range(len(for_step))]


async def test_a_dropped_group_gives_its_slot_back():
    adm = Admission(1)
    for _ in range(4):
        await adm.admit(lambda: 2)  # (0 + 1 + 1) x 2 groups
    assert not adm.allows(2)
    adm.notify(dropped=1)
    assert adm.allows(2)
    assert await adm.admit(lambda: 2) == 1  # the dropped group's replacement: step 1's
    assert not adm.allows(2)
    adm.notify(stepped=True)  # a step (even one whose push was refused) allows G more
    assert adm.allows(2)


@pytest.mark.parametrize("ranked", [True, False])
async def test_each_groups_requests_carry_the_step_it_is_for(monkeypatch, ranked):
    """The producer runs every group's plays under ``request_priority(step)`` (with
    ``engine.priority_scheduling``), hints under the step being produced, and sends no
    priority without it."""
    import types

    import msgspec

    from spade_async.generation import client
    from spade_async.loop import cycle, schedule_async
    from spade_async.recipe import Config

    cfg = Config()
    cfg = msgspec.structs.replace(cfg, engine=type(cfg.engine)(priority_scheduling=ranked),
                                  max_staleness=1, replay_envs=0, designer_enabled=False)  # fmt: skip
    seen: list[tuple[str, int | None]] = []
    envs = [types.SimpleNamespace(env_id=f"e{i}") for i in range(2)]

    async def hints(rt, window, refs, *, fresh):
        seen.append(("hints", client._PRIORITY.get()))
        return {}

    async def play(rt, refs, hints, version, n):
        seen.append((refs[0].env_id, client._PRIORITY.get()))
        return []

    monkeypatch.setattr(cycle, "env_refs", lambda rt, ids: envs)
    monkeypatch.setattr(cycle, "window_hints", hints)
    monkeypatch.setattr(cycle, "play", play)
    monkeypatch.setattr(cycle, "plays_per_env", lambda cfg, n: 1)
    rt = types.SimpleNamespace(cfg=cfg, state=types.SimpleNamespace(version=0, current_envs=[]))
    sh = schedule_async.Shared(1)
    send, recv = anyio.create_memory_object_stream(0)
    stop = anyio.Event()
    async with recv, anyio.create_task_group() as tg:
        tg.start_soon(schedule_async.producer, rt, sh, send, stop)
        for _ in range(3):
            for _ in range(2):
                await recv.receive()
            sh.admission.notify(stepped=True)
        stop.set()
        tg.cancel_scope.cancel()
    plays = [p for name, p in seen if name != "hints"]
    if not ranked:
        assert {p for _, p in seen} == {None}
        return
    assert plays[:6] == [0, 0, 1, 1, 2, 2]  # two groups per step, in admission order
    assert [p for name, p in seen if name == "hints"][:2] == [0, 1]
