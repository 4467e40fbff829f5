"""bench/pipeline.py's schedule bound, worked by hand: it must never read below the ideal
bound (the busiest stage's time), whichever stage is the busiest."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # pipeline.py imports its sibling _hw
    try:
        spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH / "pipeline.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.fixture(scope="module")
def bound(bench):
    return bench.schedule_bound


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("three", [False, True])
def test_the_bench_settings_are_a_valid_config(bench, tmp_path, quick, three):
    """Every override the bench sets names a real setting with a legal value (a renamed
    config key fails here, not ten minutes into a run); three_stage ranks the engine's
    requests by step and lets one step's rows decode at once."""
    from spade_async import recipe

    lookahead = bench.lookahead_steps(three)
    sets = bench.overrides(tmp_path, tmp_path, quick, lookahead, 1, 0)
    cfg = recipe.load(None, sets)
    plays = (bench.QUICK if quick else bench.FULL)["plays"]
    assert cfg.placement.controller_cpus == [0] and cfg.engine.cpus == [0]
    assert cfg.engine.priority_scheduling is three
    assert cfg.engine.max_running_requests == (4 * plays if three else 0)


def test_trainer_bound_is_one_fill_then_a_step_per_step(bound):
    # L=1 < R=2: end = 3, 5, 7, 9
    assert bound(4, 1.0, 2.0, 1) == 9.0


def test_latency_bound_at_one_step_of_staleness_runs_at_half_of_l_plus_r(bound):
    # L=3 > R=1, s=1: end = 4, 5, 8, 9, 12 (period (L + R) / 2 = 2)
    assert bound(5, 3.0, 1.0, 1) == 12.0
    # s=2 takes the latency off the steady state: end = 4, 5, 6, 8, 9
    assert bound(5, 3.0, 1.0, 2) == 9.0


def test_an_engine_bound_run_is_never_below_the_ideal_bound(bound):
    # the engine busiest (4 steps of 3 s = 12 s), R=1, L=3.5, s=2: the recursion alone gives
    # end = 4.5, 5.5, 6.5, 9.0, below what the engine needs
    assert bound(4, 3.5, 1.0, 2) == 9.0
    assert bound(4, 3.5, 1.0, 2, busiest_s=12.0) == 12.0


def test_never_below_the_busiest_stage_nor_one_groups_latency(bound):
    rng = random.Random(0)
    for _ in range(500):
        steps, s = rng.randint(1, 12), rng.randint(0, 3)
        e, r, tail = rng.uniform(0.1, 5), rng.uniform(0.1, 5), rng.uniform(0, 2)
        latency, busiest = e + 2 * tail, steps * max(e, r)
        got = bound(steps, latency, r, s, busiest)
        assert got >= busiest
        # the trainer's steps after the first group's latency
        assert got >= latency + steps * r - 1e-9
        # with staleness >= steps no step waits for a version: exactly that
        if s + 1 >= steps:
            assert got == pytest.approx(max(latency + steps * r, busiest), rel=1e-12)


def test_summary_shows_a_step_that_trained_fewer_samples_and_why(bench):
    """A run where an environment's plays dropped out of some steps trains a smaller batch,
    so its ratios are not the declared workload's: the summary keeps samples per step
    ({samples: steps}) and the counters each phase moved, summed over the schedule's phases."""
    phases = [
        {"schedule": "async", "first_step": 1, "steps": 2, "wall_s": 3.0, "busy_s": {"engine": 1.0},
         "controller_cpu_s": 0.5,
         "counters": {"agent/status/terminated": 32, "agent/status/crashed": 8, "staleness/dropped": 2}},
        {"schedule": "async", "first_step": 3, "steps": 1, "wall_s": 2.0, "busy_s": {"engine": 2.0},
         "controller_cpu_s": 0.5,
         "counters": {"agent/status/terminated": 32, "staleness/dropped": 1}},
        {"schedule": "sync", "first_step": 4, "steps": 1, "wall_s": 9.0, "busy_s": {"engine": 5.0},
         "controller_cpu_s": 0.5, "counters": {"agent/status/terminated": 99}},
    ]  # fmt: skip
    records = [{"step": s, "train/samples": n} for s, n in ((1, 32), (2, 24), (3, 32), (4, 32))]
    got = bench.summarise(phases, records, "async")
    assert got["trained_samples"] == 88
    assert got["samples_per_step"] == {"32": 2, "24": 1}
    assert got["counters"] == {
        "agent/status/crashed": 8,
        "agent/status/terminated": 64,
        "staleness/dropped": 3,
    }
    assert got["staleness_dropped"] == 3
