"""The designer learns, on CPU: the whole SPADE loop in the letter-window setting.

``configs/cpu-learning.toml`` (the recipe of ``spade demo --learning``): engine, sandbox
pool, validation gates, memory, hints, agent plays, regret, blend reward, per-skill
centring, trainer and weight push, all real; a random-initialised character-level tiny
Llama plays both roles. Only the setting is fixed: the designer writes one letter (a
letter-window game's width) and the family's extractor builds the file from it.

What must happen: designer samples reach the trainer with non-zero advantages, the
designer's mean blend reward rises from under 0.3 (first five steps) by at least 0.2
(mean of the second half). That reward is SPADE's own frontier measure (0.6 x the plateau of
the agent's no-hint win rate around one half + 0.4 x the hint regret), so its rise is the
designer's games moving to the agent's frontier; the curve, with |win rate - 1/2| of the
games played and the letters written, is printed (pytest -s).

It cannot flake (docs/determinism.md): every run is in deterministic mode, so what it
records is a function of its seed alone and the machine's load can only make it slower.
The rise is asserted on each of three seeds, and a control with the learning rate at 0 (the
same loop, weights never change) must show no rise: the rise is the training's doing, not
the loop's. Every wall-clock limit inside the runs, and each test's timeout, is stretched
by the machine's load (``determinism_helpers.load_factor``: the 1-minute load average per
core), so a slow environment call or generation never turns into a timeout.
"""

from __future__ import annotations

import json
import math

import pytest
from determinism_helpers import load_scaled, patient
from loop_helpers import _run, _steps

from spade_async import recipe
from spade_async.loop import cycle
from spade_async.memory.store import MemoryStore
from spade_async.rundir import RunDir
from spade_async.settings.char_model import char_model_dir
from spade_async.settings.letter_window import letter_of

RECIPE = "configs/cpu-learning.toml"
SEEDS = (0, 1, 2)
# Scripted audit plays (loop/audits.py) are off here: this test measures what the designer
# learns from its reward. In the letter-window family a garbage play (the policy's letters
# for other games) wins a wide window legitimately, so audits quarantine the very games the
# designer converges on and its reward drops to 0 (seed 0: from step 15 on, 'm' windows).
NO_AUDITS = "audit.share=0.0"
# trainer.lora (loop/lora.py: engines serve the frozen base + the pushed adapter): adapters
# on every block linear at a rank near the 64-wide model's width, at 2x the full fine-tuning
# lr. Its base's tied embedding starts at std 0.1, not 0.02: LoRA leaves embedding, head and
# final norm frozen, so with 0.02 no block output can put more than ~0.32 of the next-token
# mass on the 26 letters (uniform 0.26; a LoRA run there went 0.07 -> 0.15), with 0.1 up to
# ~0.96, as a pretrained model's embedding allows (settings/char_model.py). Same criteria.
LORA = (["trainer.lora={rank=32,alpha=64.0}", "trainer.lr=1e-1"], 0.1)
START_BELOW = 0.3  # mean designer reward over the first five steps
RISE = 0.2  # second-half mean minus the first five steps' mean
NO_RISE = RISE / 2  # the lr = 0 control stays below half the asserted rise


def _mean(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _learn(tmp_path, monkeypatch, request, seed: int, overrides=(), embedding_std=None):
    """One deterministic run; returns (first-five mean, second-half mean, designer samples
    trained with a non-zero advantage, group size) and prints the curve."""
    model = char_model_dir(tmp_path / "model", embedding_std=embedding_std)
    cfg = recipe.load(
        request.config.rootpath / RECIPE,
        [f"model='{model}'", "telemetry.dashboard='off'", f"seed={seed}", "deterministic=true",
         NO_AUDITS, *patient(), *overrides],
    )  # fmt: skip
    trained: list[tuple[str, float]] = []  # (role, advantage) of every sample the trainer took
    real = cycle.train_and_push

    async def spy(rt, samples, *, pause, **kw):
        trained.extend((s.role, s.advantage) for s in samples)
        return await real(rt, samples, pause=pause, **kw)

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
    # the agent's no-hint win rate on the distinct games played (printed: near duplicates of a
    # game are played once, so a converged designer shows one game a step)
    frontier = [_mean(abs(w - 0.5) for w in r["win_rate/values"]) for r in steps]
    print(f"\nseed {seed} {' '.join(overrides)}")
    print("step  designer_reward  agent_reward  |win-0.5|  designer letters ('-': no letter)")
    for r, d, f in zip(steps, designer, frontier, strict=True):
        print(
            f"{r['step']:>4}  {d if d is not None else float('nan'):>15.3f}  "
            f"{r['reward/agent_mean'] or 0:>12.3f}  {f:>9.3f}  {letters.get(r['step'] - 1, '')}"
        )
    nonzero = sum(a != 0 for role, a in trained if role == "designer")
    half = len(steps) // 2
    first, late = _mean(designer[:5]), _mean(designer[half:])
    print(f"designer reward: first 5 steps {first:.3f}, second half {late:.3f}")
    return first, late, nonzero, cfg.designer.samples_per_prompt, designer


@pytest.mark.slow
@pytest.mark.timeout(load_scaled(900))
@pytest.mark.parametrize("seed", SEEDS)
def test_designer_learns(tmp_path, monkeypatch, request, seed):
    first, late, nonzero, group, curve = _learn(tmp_path, monkeypatch, request, seed)
    assert nonzero >= group, "designer samples reach the trainer with non-zero advantages"
    assert first < START_BELOW, curve
    assert late >= first + RISE, curve


@pytest.mark.slow
@pytest.mark.timeout(load_scaled(900))
def test_no_rise_at_learning_rate_zero(tmp_path, monkeypatch, request):
    """The control: the same loop with ``trainer.lr = 0`` (samples still reach the trainer
    with their advantages; the weights never move) shows no rise."""
    first, late, nonzero, group, curve = _learn(
        tmp_path, monkeypatch, request, SEEDS[0], ["trainer.lr=0.0"]
    )
    assert nonzero >= group, "the control trains on the same kind of batches"
    assert first < START_BELOW, curve
    assert late < first + NO_RISE, curve


@pytest.mark.slow
@pytest.mark.timeout(load_scaled(900))
@pytest.mark.xfail(
    strict=True,
    reason="measured in deterministic mode, seed 0: LoRA rises 0.125 -> 0.294 (+0.17), short "
    "of the 0.2 asserted for full fine-tuning (seeds 0/1/2: +0.32/+0.47/+0.29); strict: a "
    "change that makes it pass must turn this back into a plain assertion",
)
def test_designer_learns_with_lora(tmp_path, monkeypatch, request):
    overrides, embedding_std = LORA
    first, late, nonzero, group, curve = _learn(
        tmp_path, monkeypatch, request, SEEDS[0], overrides, embedding_std
    )
    assert nonzero >= group, "designer samples reach the trainer with non-zero advantages"
    assert first < START_BELOW, curve
    assert late >= first + RISE, curve
