"""The designer learns, on CPU: the whole SPADE loop in the letter-window setting.

``configs/cpu-learning.toml`` (the recipe of ``spade demo --learning``): engine, sandbox
pool, validation gates, memory, hints, agent plays, regret, blend reward, per-skill
centring, trainer and weight push, all real; a random-initialised character-level tiny
Llama plays both roles. Only the setting is fixed: the designer writes one letter (a
letter-window game's width) and the family's extractor builds the file from it.

What must happen: designer samples reach the trainer with non-zero advantages, the
designer's mean blend reward rises from under 0.2 (first three steps) by at least 0.25
(mean of the second half), and the games it writes move toward the agent's frontier (the
agent's no-hint win rate on them nearer one half, a reply that built no valid game counted
as far from it as a game can be). The curve is printed (pytest -s).
"""

from __future__ import annotations

import json
import math

import pytest
from loop_helpers import _run, _steps

from spade_async import cycle, recipe
from spade_async.memory.store import MemoryStore
from spade_async.rundir import RunDir
from spade_async.settings.char_model import char_model_dir
from spade_async.settings.letter_window import letter_of

RECIPE = "configs/cpu-learning.toml"
START_BELOW = 0.2  # mean designer reward over the first three steps
RISE = 0.25  # second-half mean minus the first three steps' mean


def _mean(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_designer_learns(tmp_path, monkeypatch, request):
    model = char_model_dir(tmp_path / "model")
    cfg = recipe.load(
        request.config.rootpath / RECIPE,
        [f"model='{model}'", "telemetry.dashboard='off'", "seed=0"],
    )
    trained: list[tuple[str, float]] = []  # (role, advantage) of every sample the trainer took
    real = cycle.train_and_push

    async def spy(rt, samples, *, pause):
        trained.extend((s.role, s.advantage) for s in samples)
        return await real(rt, samples, pause=pause)

    monkeypatch.setattr(cycle, "train_and_push", spy)
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)

    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == list(range(1, cfg.max_steps + 1))
    with MemoryStore(run_dir.memory, cfg.memory) as store:
        letters: dict[int, str] = {}
        for r in map(json.loads, run_dir.metrics.read_text().splitlines()):
            if r["kind"] == "env":
                rec = store.get(r["env_id"]) if r["env_id"] else None
                code = letter_of(rec.code) if rec is not None else None
                letters[r["step"]] = letters.get(r["step"], "") + (code or "-")
    designer = [r["reward/designer_mean"] for r in steps]
    # distance from the frontier of what the designer wrote each window: |win rate - 1/2| for
    # a played game, 1/2 (as far as it gets) for a reply that built no valid game
    d = cfg.designer
    n = d.skills_per_regen * d.prompts_per_skill * d.samples_per_prompt
    frontier = [
        (sum(abs(w - 0.5) for w in r["win_rate/values"]) + 0.5 * (n - len(r["win_rate/values"])))
        / n
        for r in steps
    ]
    print("\nstep  designer_reward  agent_reward  |win-0.5|  designer letters ('-': no letter)")
    for r, d, f in zip(steps, designer, frontier, strict=True):
        print(
            f"{r['step']:>4}  {d:>15.3f}  {r['reward/agent_mean'] or 0:>12.3f}  {f:>9.3f}  "
            f"{letters.get(r['step'] - 1, '')}"
        )

    d_adv = [a for role, a in trained if role == "designer"]
    nonzero = sum(a != 0 for a in d_adv)
    print(f"designer samples trained: {len(d_adv)}, with a non-zero advantage: {nonzero}")
    group = cfg.designer.samples_per_prompt
    assert nonzero >= group, "designer samples reach the trainer with non-zero advantages"
    half = len(steps) // 2
    first, late = _mean(designer[:3]), _mean(designer[half:])
    print(f"designer reward: first 3 steps {first:.3f}, second half {late:.3f}")
    assert first < START_BELOW, designer
    assert late >= first + RISE, designer
    assert _mean(frontier[half:]) < _mean(frontier[:3]), frontier
