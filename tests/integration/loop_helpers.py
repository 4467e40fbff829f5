"""Helpers shared by the loop integration tests (imported as a sibling module)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio

from spade_async import recipe
from spade_async.rundir import RunDir

HERE = Path(__file__).parent
EXAMPLES = Path(__file__).parents[2] / "spade_async" / "envs" / "examples"


def _config(tiny_model: Path, tmp_path: Path, mode: str, **extra: str) -> recipe.Config:
    pool = tmp_path / "pool"
    pool.mkdir(exist_ok=True)
    for name in ("mastermind.py", "modular_lock.py"):
        shutil.copy(EXAMPLES / name, pool / name)
    shutil.copy(HERE / "envs" / "lower_share.py", pool / "lower_share.py")  # varied rewards
    overrides = [
        f"mode={mode}",
        "schedule='sync'",
        f"model='{tiny_model}'",
        "max_steps=2",
        "regen_interval=2",
        "replay_envs=3",
        "initial_memory=''",
        f"fixed_pool='{pool}'",
        "checkpoint_every=1",
        "designer.skills_per_regen=1",
        "designer.prompts_per_skill=1",
        "designer.samples_per_prompt=2",
        "designer.retries=1",
        "designer.max_new_tokens=24",
        "hint.max_new_tokens=8",
        "hint.retries=0",
        "agent.plays_nohint=3",
        "agent.plays_hint=2",
        "agent.max_turns=2",
        "agent.max_turn_tokens=6",
        "agent.cut_reply='step'",  # a cut 1-token reply is the action
        "corpus.max_words=50",
        "trainer.micro_batch_tokens=1024",
        "telemetry.dashboard='off'",
        "envs.max_workers=4",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return recipe.load(None, overrides)


def _run(cfg: recipe.Config, run_dir: RunDir) -> None:
    from spade_async.loop.run import train

    if not run_dir.exists():
        run_dir.create().write_config(cfg)
    assert anyio.run(train, cfg, run_dir) == 0


def _steps(run_dir: RunDir) -> list[dict]:
    lines = run_dir.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]
