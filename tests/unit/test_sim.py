"""The node in virtual time (spade_async/sim): the clock, the prediction of the CPU
pipeline bench's measured walls, the loop at scale, and bad cost-model input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from spade_async import recipe
from spade_async.errors import ConfigError
from spade_async.sim.calibrate import cpu_costs
from spade_async.sim.clock import Deadlock, run_virtual
from spade_async.sim.costs import gpu_costs
from spade_async.sim.runtime import simulate

ROOT = Path(__file__).resolve().parents[2]


def test_virtual_clock_jumps_and_reports_a_deadlock():
    async def sleepers() -> float:
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(anyio.sleep, 60.0 * i)
        with anyio.move_on_after(5.0):
            await anyio.Event().wait()
        return anyio.current_time()

    assert run_virtual(sleepers) == pytest.approx(99 * 60.0 + 5.0)

    async def stuck() -> None:
        await anyio.Event().wait()

    with pytest.raises(Deadlock):
        run_virtual(stuck)


def _pipeline_cfg(saved: dict, schedule: str):
    sys.path.insert(0, str(ROOT / "bench"))
    import pipeline as P

    w = saved["workload"]
    three, stale = w["name"] == "three_stage", w["max_staleness"]
    over = P.overrides(ROOT, ROOT, False, P.lookahead_steps(three, stale), stale, 0)
    return recipe.load(None, [*over, f"schedule='{schedule}'"])


@pytest.mark.parametrize("name", ["pipeline", "pipeline_three_stage"])
def test_sim_predicts_the_cpu_pipeline_within_10_percent(name):
    """Costs from the saved stage timings; the loop's own schedules predict the measured
    walls (one phase simulated, times the phases measured)."""
    saved = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
    costs = cpu_costs(saved)
    for schedule in ("sync", "async"):
        m = saved[schedule]
        sim = simulate(_pipeline_cfg(saved, schedule), costs, m["steps"] // m["phases"])
        predicted = sim["wall_s"] * m["phases"]
        assert abs(predicted / m["wall_s"] - 1) <= 0.10, (name, schedule, predicted, m["wall_s"])
        assert sim["max_sample_age"] <= saved["workload"]["max_staleness"]


def test_8b_games_recipe_runs_in_virtual_time():
    """The real recipe's loop (designer window, hints, plays, admission, staleness) on
    simulated H100s, a small play count: no deadlock, versions in order, ages bounded."""
    path = ROOT / "configs" / "qwen3-8b-games.toml"
    cfg = recipe.load(path, ["agent.plays_nohint=2", "agent.plays_hint=2",
                             "agent.plays_per_env='fixed'", "max_steps=2"])  # fmt: skip
    costs = gpu_costs(cfg.model, "h100-80gb", engine_gpus=4, tp=1, trainer_gpus=4)
    out = simulate(cfg, costs, 2)
    assert out["steps"] == 2 and out["versions"] == [1, 2]
    assert out["max_sample_age"] <= cfg.max_staleness
    assert out["trained_samples"] > 0 and out["decoded_tokens"] > 0
    assert 0 < out["engine_busy_share"] <= 1 and 0 < out["trainer_busy_share"] <= 1


def test_a_missing_gpu_or_model_is_named_with_its_parameters():
    with pytest.raises(ConfigError, match=r"no GPU 'a100-80gb'.*hbm_tb_s, bf16_tflops"):
        gpu_costs("/models/Qwen3-8B", "a100-80gb", engine_gpus=4, tp=1, trainer_gpus=4)
    with pytest.raises(ConfigError, match=r"no model 'llama-9b'.*params, active_params"):
        gpu_costs("/models/Llama-9B", "h100-80gb", engine_gpus=4, tp=1, trainer_gpus=4)


def test_plan_throughput_refuses_unknown_gpu_in_one_line(capsys):
    from spade_async.cli.dispatch import main

    rc = main(["plan", str(ROOT / "configs" / "qwen3-8b-games.toml"), "--throughput",
               "--gpu", "a100-80gb"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "supply [gpu.a100-80gb]" in err[0]


def test_cost_file_adds_a_gpu(tmp_path):
    f = tmp_path / "costs.toml"
    f.write_text("[gpu.a100-80gb]\nhbm_tb_s = 2.0\nbf16_tflops = 312\nmemory_gib = 80\n")
    c = gpu_costs("/models/Qwen3-8B", "a100-80gb", engine_gpus=4, tp=1, trainer_gpus=4,
                  costs_file=f)  # fmt: skip
    h = gpu_costs("/models/Qwen3-8B", "h100-80gb", engine_gpus=4, tp=1, trainer_gpus=4)
    assert c.iter_fixed_s > h.iter_fixed_s and c.train_per_token_s > h.train_per_token_s
    assert msgspec.json.encode(c.notes)
