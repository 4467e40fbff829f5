"""The whole sequential loop on CPU with a tiny model: engine, pool, memory, trainer, push."""

from __future__ import annotations

import shutil

import pytest
from loop_helpers import HERE, _config, _run, _steps

from spade_async import recipe
from spade_async.memory.store import MemoryStore
from spade_async.rundir import RunDir


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["spade", "fixed_pool"])
def test_two_steps_then_resume(tiny_model, tmp_path, mode):
    cfg = _config(tiny_model, tmp_path, mode)
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    assert run_dir.latest_checkpoint()[0] == 2
    assert (run_dir.hf / "config.json").is_file()
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agent/episodes"] > 0 for r in steps)
    assert steps[-1]["version"] >= 1, "the trainer stepped and the engines serve its weights"
    assert len(list(run_dir.episodes.glob("*.txt"))) >= 1
    with MemoryStore(run_dir.memory, cfg.memory) as store:
        played = [r for r in store.records() if r.stats.plays_nohint > 0]
        assert played, "memory holds play statistics"
    if mode == "spade":
        assert steps[-1]["designer/generated"] == 2  # the designer ran once in the window
    # resume: same run dir, two more steps, starting after step 2
    _run(recipe.load(run_dir.config, ["max_steps=4"]), run_dir)
    assert [r["step"] for r in _steps(run_dir)][-2:] == [3, 4]
    assert run_dir.latest_checkpoint()[0] == 4


@pytest.mark.timeout(900)
def test_end_to_end_learning(tiny_model, tmp_path):
    """fixed_pool on a trivially learnable environment: the engine-sampled win rate of a tiny
    model rises from <= 0.2 to >= 0.8. Only a working weight push can make that happen."""
    pool = tmp_path / "pool"
    pool.mkdir()
    shutil.copy(HERE / "envs" / "first_letter.py", pool / "first_letter.py")
    cfg = recipe.load(
        None,
        [
            "mode='fixed_pool'",
            "schedule='sync'",
            f"model='{tiny_model}'",
            "max_steps=40",
            "replay_envs=1",
            "initial_memory=''",
            f"fixed_pool='{pool}'",
            "checkpoint_every=100",
            "agent.plays_nohint=32",
            "agent.max_turns=1",
            "agent.max_turn_tokens=2",
            "agent.cut_reply='step'",  # a cut 1-token reply is the action
            "agent.temperature=1.0",
            "telemetry.episodes_per_step=0",
            "trainer.lr=5e-2",
            "trainer.micro_batch_tokens=4096",
            "telemetry.dashboard='off'",
            "envs.max_workers=2",
            "max_concurrent_episodes=32",
        ],
    )
    run_dir = RunDir(tmp_path / "run")

    class Done(Exception):
        pass

    _run(cfg, run_dir)
    wins = [r["win_rate/values"][0] for r in _steps(run_dir)]
    assert wins[0] <= 0.2, wins
    assert max(wins[-5:]) >= 0.8, wins
