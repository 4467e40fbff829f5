"""The whole sync loop taking turns with its CPU engines as a colocated SGLang run does:
every train step releases the engines' memory (all tags), trains, resumes the weights,
pushes, resumes the rest. The engines keep SGLang's offload-set bookkeeping (a resume of a
tag no longer released kills them, as it kills SGLang's scheduler) and the recorder
(conftest.py) fails the test on any refused call. ``placement.colocate`` needs SGLang
engines, so the colocated turn is switched on for the CPU run here."""

from __future__ import annotations

import json

import pytest
from loop_helpers import _config, _run, _steps

from spade_async.loop import cycle
from spade_async.rundir import RunDir


@pytest.mark.slow  # ~1 min on 2 cores; tests/unit/test_colocated_turns.py is the fast one
@pytest.mark.timeout(600)
def test_colocated_turns_over_a_whole_run(tiny_model, tmp_path, monkeypatch, engine_trace):
    original = cycle.train_and_push

    async def colocated(rt, samples, *, pause, normaliser=0.0):
        rt.release_memory = True  # what placement.colocate + release_memory set for SGLang
        return await original(rt, samples, pause=pause, normaliser=normaliser)

    monkeypatch.setattr(cycle, "train_and_push", colocated)
    cfg = _config(tiny_model, tmp_path, "fixed_pool")
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["version"] == 2
    calls = [json.loads(x)["path"] for f in engine_trace.glob("*.jsonl")
             for x in f.read_text().splitlines()]  # fmt: skip
    # per step: release, resume weights, push, resume the rest (nothing refused: conftest)
    assert calls.count("/release_memory_occupation") == 2
    assert calls.count("/resume_memory_occupation") == 4
    assert calls.count("/update_weights_from_disk") == 2
