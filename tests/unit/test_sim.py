"""The node in virtual time (spade_async/sim): the clock, the prediction of the CPU
pipeline bench's measured walls, the loop at scale, and bad cost-model input."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

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
    return recipe.load(None, [*over, f"schedule='{schedule}'", "audit.share=0.0"])  # predate audits


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


@pytest.mark.parametrize("name", ["pipeline", "pipeline_three_stage", "pipeline_three_stage_s2"])
def test_sync_arm_alone_predicts_the_async_wall_within_5_percent(name):
    """Out of sample: the async wall from the sync arm's costs alone (the async arm's timings
    never enter them), the engine scaled by the async contention measured on the *other*
    saved runs (sim/heldout.py)."""
    from spade_async.sim.heldout import RUNS, async_costs, load_run, predict_wall

    runs = {n: load_run(ROOT, n) for n in RUNS}
    saved = runs[name]
    # the quiet runs' contention (tests/unit/test_heldout.py: never the predicted run's)
    [costs] = async_costs(runs, name)["sync_to_async+contention"]
    sync_only = cpu_costs(saved, ("sync",))
    assert sync_only.iter_fixed_s == cpu_costs({**saved, "async": None}, ("sync",)).iter_fixed_s
    row = predict_wall(ROOT, saved, costs, "async")
    assert abs(row["error"]) <= 0.05, row
    assert row["max_sample_age"] <= saved["workload"]["max_staleness"]


def test_steady_state_windows_and_the_best_sync_baseline():
    """Arithmetic of sim/throughput.py: the warm-up and tail windows left out, a short run
    says so, the headline is over the best sync row (colocated included), rows marked."""
    from spade_async.sim.throughput import Row, compare, format_rows, window_means

    # 4-step windows: warm-up steps of 10 s, then 5 s a step, the tail window 1 s a step
    t = list(itertools.accumulate([10.0] * 4 + [5.0] * 16 + [1.0] * 4 + [1.0]))
    assert window_means(t, 4) == [5.0, 5.0, 5.0, 5.0]  # neither the warm-up nor the tail
    assert window_means(t[:15], 4) == []  # under four windows: no steady figure
    rows = [
        Row("4+4", "sync", 1, step_s=300.0, window_s=[300.0, 300.0], steps=17, window=4),
        Row("colocated", "sync", 1, step_s=250.0, window_s=[245.0, 250.0], steps=17, window=4),
        Row(
            "4+4",
            "async",
            1,
            step_s=125.0,
            window_s=[100.0, 125.0],
            steps=17,
            window=4,
            over_sync=300 / 125,
        ),  # fmt: skip
        Row("4+4", "async", 2, step_s=100.0, window_s=[98.0, 100.0], steps=17, window=4),
    ]
    for r in rows:
        r.samples_per_hour, r.engine_busy, r.trainer_busy = 1.0, 0.5, 0.5
    compare(rows)
    assert rows[1].mark == "best sync" and rows[3].mark == "best async"
    assert rows[3].over_best_sync == pytest.approx(2.5) and rows[3].best_sync == "colocated"
    assert rows[3].ratio_by_steps == [(4, 2.5), (8, 2.5)]
    # 245/100 -> 250/125: the ratio moved 18% with the last window: not steady, no figure
    assert rows[2].over_best_sync is None and "not steady" in rows[2].note
    table = format_rows(rows)
    assert "<- best sync" in table and "<- best async" in table and "2.50x" in table


def test_a_real_tokenizer_in_the_path_keeps_the_workload():
    """RealTokenizerInPath renders with the real chat template and encodes with the real
    tokenizer (its CPU is the controller's), but the ids keep the simulated count and role."""
    from spade_async.roles.agent import GAMES_SYSTEM
    from spade_async.sim.engine import ROLE_AGENT
    from spade_async.sim.parts import RealTokenizerInPath, SimTokenizer

    calls = []

    class Fake:
        name_or_path, chat_template = "fake", "{{ x }}"

        def apply_chat_template(self, messages, **kw):
            return "<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>"

        def __call__(self, text, add_special_tokens=False):
            calls.append(text)
            return SimpleNamespace(input_ids=[0])  # what encode_ids reads (generation/chat.py)

    tok = RealTokenizerInPath(Fake())
    text = tok.apply_chat_template([{"role": "system", "content": GAMES_SYSTEM}])
    ids = tok(text).input_ids
    assert calls == [text] and ids[0] == ROLE_AGENT
    assert len(ids) == len(SimTokenizer()(text).input_ids) == len(text) // 4


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
