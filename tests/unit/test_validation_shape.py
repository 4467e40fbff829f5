"""Validation shaped like training (envs/gates.py): every instance the gates use is opened,
reset once, stepped at most max_turns times and closed, as a training play's; solution()
runs on instances of its own that are never stepped; a games environment is never asked
for its tools. Checked on the calls the pool receives."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.validate import ValidateConfig, validate_source

ROOT = Path(__file__).parents[2]


class _SpyPool(EnvPool):
    """The real pool, recording each instance's calls in order."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.calls: dict[int, list[str]] = defaultdict(list)

    async def open(self, *a, **k):
        inst = await super().open(*a, **k)
        self.calls[inst.id].append("open")
        return inst

    async def reset(self, inst, seed=None):
        self.calls[inst.id].append("reset")
        return await super().reset(inst, seed)

    async def step(self, inst, action):
        self.calls[inst.id].append("step")
        return await super().step(inst, action)

    async def solution(self, inst):
        self.calls[inst.id].append("solution")
        return await super().solution(inst)

    async def get_tools(self, inst):
        self.calls[inst.id].append("tools")
        return await super().get_tools(inst)

    async def close(self, inst):
        self.calls[inst.id].append("close")
        return await super().close(inst)


def _check(name: str, setting: str | None, max_turns: int):
    src = (ROOT / "spade_async" / "envs" / "examples" / name).read_text()

    async def main():
        async with _SpyPool(PoolConfig(max_workers=2, prewarm=0)) as pool:
            v = await validate_source(
                src, pool=pool, config=ValidateConfig(max_turns=max_turns), setting=setting
            )
            return v, dict(pool.calls)

    return anyio.run(main)


@pytest.mark.parametrize(
    "name, setting", [("mastermind.py", "games"), ("order_ledger_tool.py", "tool_use")]
)
def test_every_gate_instance_is_played_as_training_plays_one(name, setting):
    v, calls = _check(name, setting, 25)
    assert v.valid, v.reason
    assert len(calls) >= 10  # a fresh instance per play
    solutions = 0
    for seq in calls.values():
        assert seq[0] == "open" and seq[-1] == "close" and seq.count("close") == 1, seq
        assert seq.count("reset") == 1 and seq[1] == "reset", seq
        assert seq.count("step") <= 25, seq
        if "solution" in seq:  # the hint writer's sequence: never stepped
            solutions += 1
            assert seq == ["open", "reset", "solution", "close"], seq
            continue
        if setting == "games":
            assert "tools" not in seq, seq
        else:
            assert seq[2] == "tools", seq  # after the reset, as roles/agent.py asks
    assert solutions == len(v.seeds)


def test_plays_stop_at_max_turns():
    """The long garbage play (long_turns = 30) stops at max_turns, as an episode does."""
    v, calls = _check("mastermind.py", "games", 7)
    assert max(seq.count("step") for seq in calls.values()) == 7
    assert v.valid, v.reason
