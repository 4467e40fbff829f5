"""Routing replay through the whole loop on CPU: a tiny random Qwen3-MoE, the async schedule,
multi-turn episodes (each turn asks from the rows it lacks), then a resumed run. Every
sample of every batch the trainer receives (read back from the batch, on its way to the
trainer) carries routes covering every token it trains on; the trainer replays them on
every micro-batch (route_mismatch 0) and trains no sample without them."""

from __future__ import annotations

import shutil

import pytest
from loop_helpers import EXAMPLES, HERE, _run, _steps

from spade_async import recipe
from spade_async.generation.routed_experts import check_sample, route_shape_of
from spade_async.rundir import RunDir


@pytest.mark.slow  # two runs of the whole loop (async, then resumed): ~2 min on 2 cores
@pytest.mark.timeout(900)
def test_async_and_resumed_runs_keep_every_samples_routes(tmp_path, monkeypatch):
    from spade_async.models import tiny_moe_dir
    from spade_async.trainer.client import AsyncTrainerClient

    moe = tiny_moe_dir(tmp_path / "moe")
    pool = tmp_path / "pool"
    pool.mkdir()
    shutil.copy(HERE / "envs" / "first_letter.py", pool / "first_letter.py")
    shutil.copy(EXAMPLES / "mastermind.py", pool / "mastermind.py")  # several turns
    batches = []
    train_step = AsyncTrainerClient.train_step

    async def record(self, batch):
        batches.append(batch)
        return await train_step(self, batch)

    monkeypatch.setattr(AsyncTrainerClient, "train_step", record)
    cfg = recipe.load(None, [
        "mode='fixed_pool'", "schedule='async'", f"model='{moe}'", "max_steps=2",
        "replay_envs=2", "initial_memory=''", f"fixed_pool='{pool}'", "checkpoint_every=1",
        "agent.plays_nohint=4", "agent.max_turns=3", "agent.max_turn_tokens=3",
        "agent.cut_reply='step'", "agent.temperature=1.0", "trainer.routing_replay=true",
        "trainer.micro_batch_tokens=256", "telemetry.dashboard='off'", "envs.max_workers=2",
    ])  # fmt: skip
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    first = len(batches)
    _run(recipe.load(run_dir.config, ["max_steps=3"]), run_dir)  # resumed from step 2
    assert [r["step"] for r in _steps(run_dir)] == [1, 2, 3]
    assert first >= 2 and len(batches) > first
    shape = route_shape_of(moe)
    turns = 0
    for batch in batches:
        for s in batch.samples:
            check_sample(s.routed_experts, shape, len(s.token_ids), s.loss_mask)
            turns = max(
                turns, sum(1 for a, b in zip(s.loss_mask, s.loss_mask[1:], strict=False) if b > a)
            )
    assert turns >= 2, "no multi-turn episode reached the trainer"
    for r in _steps(run_dir):
        assert r["train/route_mismatch"] == 0.0 and r["train/route_replay"] == 1.0
        assert r["train/route_samples_missing"] == 0 and r["train/route_samples_bad"] == 0
