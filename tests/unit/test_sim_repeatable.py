"""The simulator is repeatable: the same recipe, costs and seed give the same virtual-time
figures, in one process and in another with another hash seed (what ``--jobs`` does); a run
stopped early by ``until`` is the prefix of a longer one (``--steps auto``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spade_async import recipe
from spade_async.sim.costs import gpu_costs
from spade_async.sim.runtime import simulate

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["agent.plays_nohint=2", "agent.plays_hint=2", "agent.plays_per_env='fixed'"]
# what a run's virtual time decides (the controller's real CPU and memory are left out)
FIGURES = ("wall_s", "busy_s", "step_times", "samples_per_step", "decoded_tokens", "versions",
           "max_ages", "episodes", "trained_tokens", "engine_busy_share", "trainer_busy_share")  # fmt: skip


def figures(schedule: str, steps: int, until=None) -> dict:
    """A few steps of the 8B games recipe, two plays a group, on 4+4 simulated H100s."""
    path = ROOT / "configs" / "qwen3-8b-games.toml"
    cfg = recipe.load(path, [*SMALL, f"schedule='{schedule}'"])
    costs = gpu_costs(cfg.model, "h100-80gb", engine_gpus=4, tp=1, trainer_gpus=4)
    out = simulate(cfg, costs, steps, until=until)
    return {k: out[k] for k in FIGURES}


def test_the_same_run_gives_the_same_figures_twice():
    first = figures("async", 3)
    assert len(first["step_times"]) == 3 and first["decoded_tokens"] > 0
    assert figures("async", 3) == first  # same process: no state carried between runs


@pytest.mark.slow
def test_another_process_with_another_hash_seed_gives_the_same_figures():
    """What ``--jobs`` does: each simulation in a spawned process (its own hash seed)."""
    first = figures("async", 3)
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'tests' / 'unit')!r}); "
            "from test_sim_repeatable import figures; print(json.dumps(figures('async', 3)))")  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300, check=True)  # fmt: skip
    other = json.loads(out.stdout.strip().splitlines()[-1])
    assert other == json.loads(json.dumps(first))


def test_sync_is_repeatable_and_until_stops_a_run_as_a_prefix_of_a_longer_one():
    seen = []

    def until(times: list[float], designed: list[int]) -> bool:
        seen.append(len(times))
        assert len(designed) == len(times) and designed[0] > 0  # the first step designs
        return len(times) == 3

    stopped = figures("sync", 6, until=until)
    assert seen == [1, 2, 3] and stopped["versions"] == [1, 2, 3]
    assert figures("sync", 6, until=until) == stopped
    # the run to 4 steps agrees on the first 3 (its own last step ends a window early and
    # checkpoints: the tail a steady-state figure leaves out)
    longer = figures("sync", 4)
    assert longer["step_times"][:3] == stopped["step_times"]
    assert longer["samples_per_step"][:3] == stopped["samples_per_step"]


def test_auto_settles_at_a_window_end_on_the_reported_mean():
    """``settled``: only at a window's end, on ``window_means`` (warm-up and last window out)
    moving less than 2% with its last measured window."""
    import itertools

    from spade_async.sim.throughput import settled, window_means

    # 4-step windows: warm-up 10 s a step, then windows alternating 4 and 6 s a step
    steps = [10.0] * 4 + [4.0] * 4 + [6.0] * 4 + [4.0] * 4 + [6.0] * 4 + [4.0] * 4
    t = list(itertools.accumulate(steps))
    assert window_means(t[:16], 4) == [4.0, 5.0]  # moved 25%
    assert not settled(t[:16], 4) and not settled(t[:15], 4)
    many = list(itertools.accumulate([10.0] * 4 + [4.0, 6.0] * 60))
    means = window_means(many, 4)
    assert all(m == 5.0 for m in means) and settled(many[:12], 4) is False  # 3 windows: too few
    assert settled(many[:16], 4) and not settled(many[:17], 4)  # 17: not a window's end


def test_design_cycle_windows_follow_the_runs_own_regenerations():
    """Async designs every 5-6 steps at regen_interval 4: windows cut where the designer's
    count grew hold one design step each, so a spike every 5 steps gives a flat mean (fixed
    4-step windows beat against it)."""
    import itertools

    from spade_async.sim.throughput import bounds, settled, window_means, window_starts

    steps = ([300.0] + [100.0] * 4) * 8  # a design step of 300 s, then 4 of 100 s
    t = list(itertools.accumulate(steps))
    designed = list(itertools.accumulate([24 if i % 5 == 0 else 0 for i in range(len(steps))]))
    starts = window_starts(designed, 4)
    assert starts == list(range(0, 40, 5)) and window_starts([0] * 40, 4) is None
    assert bounds(40, 4, starts) == starts and bounds(41, 4, starts + [40]) == starts + [40]
    means = window_means(t, 4, starts)
    assert means == [140.0] * 5  # 7 complete cycles: warm-up and last out
    fixed = window_means(t, 4)
    assert max(fixed) - min(fixed) > 10  # 4-step windows beat against the 5-step cycle
    assert settled(t[:36], 4, window_starts(designed[:36], 4))  # a cycle just started
    assert not settled(t[:37], 4, window_starts(designed[:37], 4))  # mid-cycle: no check


def test_settle_over_two_windows_asks_each_to_move_the_mean_under_two_percent():
    from spade_async.sim.throughput import steady

    assert steady([100.0, 110.0, 110.5], 1) and not steady([100.0, 110.0, 110.5], 2)
    assert steady([100.0, 110.0, 110.5, 111.0], 2) and not steady([110.0], 1)
