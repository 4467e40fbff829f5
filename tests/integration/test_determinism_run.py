"""Two CPU runs of one seed in deterministic mode repeat (docs/determinism.md).

The whole SPADE loop of ``configs/cpu-learning.toml`` (engine, sandbox pool, validation,
memory, hints, plays, rewards, trainer, weight push), run twice from scratch with
``deterministic = true``: the step records are byte-identical once their time fields are
removed, the memory records are identical (times removed) and so is every weight of the
final export. A third run with another seed differs, so the comparison can fail.
"""

from __future__ import annotations

import pytest
from determinism_helpers import load_scaled, memory_bytes, patient, step_bytes, weight_sums
from loop_helpers import _run

from spade_async import recipe
from spade_async.rundir import RunDir
from spade_async.settings.char_model import char_model_dir

RECIPE = "configs/cpu-learning.toml"
STEPS = 4


def _one(root, model, seed: int, rootpath):
    cfg = recipe.load(
        rootpath / RECIPE,
        [f"model='{model}'", "telemetry.dashboard='off'", f"seed={seed}", f"max_steps={STEPS}",
         "deterministic=true", *patient()],
    )  # fmt: skip
    run_dir = RunDir(root)
    _run(cfg, run_dir)
    return step_bytes(run_dir), memory_bytes(run_dir, cfg), weight_sums(run_dir.hf)


@pytest.mark.slow
@pytest.mark.timeout(load_scaled(400))
def test_two_runs_of_one_seed_repeat(tmp_path, request):
    model = char_model_dir(tmp_path / "model")
    a = _one(tmp_path / "a", model, 0, request.config.rootpath)
    b = _one(tmp_path / "b", model, 0, request.config.rootpath)
    steps_a, memory_a, weights_a = a
    steps_b, memory_b, weights_b = b
    assert steps_a.count(b'"step":') == STEPS
    assert steps_a == steps_b  # byte-identical step records, times removed
    assert memory_a == memory_b  # the same environments with the same statistics
    assert weights_a == weights_b  # every tensor of the final weights
    initial = weight_sums(model)
    shared = weights_a.keys() & initial.keys()
    assert shared and any(weights_a[k] != initial[k] for k in shared)  # and they were trained
    other = _one(tmp_path / "c", model, 1, request.config.rootpath)
    assert other[0] != steps_a and other[2] != weights_a  # the seed matters: it can fail
