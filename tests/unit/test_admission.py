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
    ahead: list[int] = []
    ages: list[int] = []

    async def producer() -> None:
        while True:
            await adm.admit(lambda: G)
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


async def test_a_dropped_group_gives_its_slot_back():
    adm = Admission(1)
    for _ in range(4):
        await adm.admit(lambda: 2)  # (0 + 1 + 1) x 2 groups
    assert not adm.allows(2)
    adm.notify(dropped=1)
    assert adm.allows(2)
    await adm.admit(lambda: 2)
    assert not adm.allows(2)
    adm.notify(stepped=True)  # a step (even one whose push was refused) allows G more
    assert adm.allows(2)
