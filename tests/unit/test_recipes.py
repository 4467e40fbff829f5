"""Every recipe in configs/ loads; the GPU recipes' launch plans and reference hyper-parameters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from spade_async import placement, recipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ALL = sorted(p.name for p in CONFIGS.glob("*.toml"))
GPU = [n for n in ALL if n.startswith("qwen3-") and "node" not in n]  # one node
# (the multi-node recipes, *-Nnode.toml: tests/unit/test_placement_nodes.py)

# recipe -> (model dir, engine TP groups, trainer GPUs, KL coefficient). Models: the
# reference's 4B and 30B recipes train the Instruct-2507 (non-thinking) checkpoints.
EXPECTED = {
    "qwen3-4b-games.toml": (
        "/models/Qwen3-4B-Instruct-2507",
        [[0], [1], [2], [3]],
        [4, 5, 6, 7],
        0.0,
    ),
    "qwen3-4b-tool-use.toml": (
        "/models/Qwen3-4B-Instruct-2507",
        [[0], [1], [2], [3]],
        [4, 5, 6, 7],
        0.005,
    ),
    "qwen3-8b-games.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-8b-tool-use.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-8b-fixed-pool.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-8b-rg-fixed-pool.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-30b-a3b-games.toml": (
        "/models/Qwen3-30B-A3B-Instruct-2507",
        [[0, 1]],
        [2, 3, 4, 5, 6, 7],
        0.0,
    ),
    "qwen3-30b-a3b-tool-use.toml": (
        "/models/Qwen3-30B-A3B-Instruct-2507",
        [[0, 1]],
        [2, 3, 4, 5, 6, 7],
        0.005,
    ),
    # 8xH100: the same, with the trainer's optimizer state in host memory (trainer.offload)
    "qwen3-30b-a3b-games-h100.toml": (
        "/models/Qwen3-30B-A3B-Instruct-2507",
        [[0, 1]],
        [2, 3, 4, 5, 6, 7],
        0.0,
    ),
}

# The reference's shipped flags per recipe (cmd/games/train_spade_{4b,8b,30b}.sh,
# cmd/tool_use/_train_spade_blend.sh for 8B/30B, cmd/tool_use/train_spade_4b.sh for 4B):
# regeneration interval (= designer delay), designer tokens, hint tokens, document size,
# no-hint / hinted plays, global batch, reward variant, compact filter, KL.
REFERENCE = {
    "qwen3-4b-games.toml": (4, 16384, 4096, 6000, 8, 16, 192, "blend", False, 0.0),
    "qwen3-8b-games.toml": (4, 20000, 4096, 6000, 8, 16, 192, "blend", False, 0.005),
    "qwen3-30b-a3b-games.toml": (4, 16384, 4096, 6000, 8, 16, 192, "blend", False, 0.0),
    "qwen3-30b-a3b-games-h100.toml": (4, 16384, 4096, 6000, 8, 16, 192, "blend", False, 0.0),
    "qwen3-4b-tool-use.toml": (32, 16384, 512, 4000, 16, 4, 256, "regret", True, 0.005),
    "qwen3-8b-tool-use.toml": (8, 20000, 2048, 4000, 8, 16, 192, "blend", True, 0.005),
    "qwen3-30b-a3b-tool-use.toml": (8, 16384, 2048, 4000, 8, 16, 192, "blend", True, 0.005),
}


def test_every_gpu_recipe_is_checked():
    assert sorted(EXPECTED) == GPU


@pytest.mark.parametrize("name", ALL)
def test_recipe_loads(name):
    cfg = recipe.load(CONFIGS / name)
    assert cfg.name == Path(name).stem


@pytest.mark.parametrize("name", GPU)
def test_gpu_recipe_plan(name):
    model, groups, trainer_gpus, kl = EXPECTED[name]
    cfg = recipe.load(CONFIGS / name)
    assert (cfg.model, cfg.engine.kind, cfg.engine.gpus) == (model, "sglang", groups)
    assert (cfg.placement.trainer_gpus, cfg.placement.colocate) == (trainer_gpus, False)
    plan = placement.launch_plan(cfg, model_dir=cfg.model, run_dir="/runs/x")
    engines, trainer = plan[:-1], plan[-1]
    assert [e.gpus for e in engines] == groups
    for i, (e, group) in enumerate(zip(engines, groups, strict=True)):
        a = e.argv
        assert "sglang.launch_server" in a and a[a.index("--model-path") + 1] == model
        assert a[a.index("--tp-size") + 1] == str(len(group)) and e.ranks == len(group)
        assert a[a.index("--port") + 1] == str(30000 + i)
        assert e.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, group))
    t = trainer.argv
    assert "torch.distributed.run" in t and f"--nproc-per-node={len(trainer_gpus)}" in t
    assert t[t.index("--model-dir") + 1] == model and trainer.ranks == len(trainer_gpus)
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, trainer_gpus))}
    sent = msgspec.json.decode(t[t.index("--config-json") + 1])
    assert sent["kl_coef"] == kl and sent["activation_checkpointing"] and sent["mixed_precision"]
    assert not set(trainer.gpus) & {g for grp in groups for g in grp}  # disaggregated


@pytest.mark.parametrize("name", GPU)
def test_gpu_recipe_reference_hyper_parameters(name):
    cfg = recipe.load(CONFIGS / name)
    tr = cfg.trainer
    assert (tr.lr, tr.clip_low, tr.clip_high, tr.temperature) == (1e-6, 0.2, 0.28, 0.6)
    assert (cfg.max_steps, cfg.schedule, cfg.agent.max_turns) == (400, "async", 25)
    # the reference's agent: 8192 new tokens per turn in a 32768-token context, a reply cut
    # without EOS ends the episode (reward 0); top_p 0.95 / top_k 20 (SPARE's defaults)
    a = cfg.agent
    assert (a.max_turn_tokens, a.max_episode_tokens, a.cut_reply) == (8192, 32768, "end")
    assert (a.temperature, a.top_p, a.top_k) == (0.6, 0.95, 20)
    # the reference's optimiser and loss (slime defaults + its recipes' flags)
    assert (tr.loss_agg, tr.weight_decay, tr.betas) == ("seq-mean-token-mean", 0.1, (0.9, 0.98))
    assert (tr.kl_coef, tr.kl_reference) == (EXPECTED[name][3], "initial")
    assert tr.entropy_coef == 0.0 and tr.tis_cap > 0
    if cfg.mode == "fixed_pool":
        assert cfg.agent.plays_nohint == 16
        assert not cfg.designer_enabled and cfg.agent.plays_hint == 0 and cfg.replay_envs == 24
        return
    regen, d_tokens, h_tokens, words, nohint, hint, gbs, variant, compact, kl = REFERENCE[name]
    d = cfg.designer
    assert d.setting == ("tool_use" if "tool-use" in name else "games")
    assert (d.temperature, d.top_p, d.top_k) == (0.6, 0.95, 20)
    # the corpus path renders the designer prompt without thinking at every size
    assert d.enable_thinking is False and not d.llm_validator and d.gates == "strict"
    assert (cfg.regen_interval, d.max_new_tokens, cfg.hint.max_new_tokens) == (
        regen,
        d_tokens,
        h_tokens,
    )
    assert (cfg.corpus.max_words, a.plays_nohint, a.plays_hint, cfg.batch_samples) == (
        words,
        nohint,
        hint,
        gbs,
    )
    assert (cfg.rewards.variant, a.compact_filter, tr.kl_coef) == (variant, compact, kl)
    assert a.mask_malformed_tool_calls == ("tool-use" in name)
    assert cfg.rewards.fault_penalty == "reference"
    assert (cfg.rewards.blend_regret_weight, cfg.rewards.regret_scale) == (0.4, 0.15)
    assert (cfg.rewards.plateau_low, cfg.rewards.plateau_high) == (0.4, 0.6)
    assert (cfg.rewards.plateau_ramp, cfg.rewards.regret_floor) == (0.25, True)
    # one grounding document per environment; the global batch over the environments
    envs = d.skills_per_regen * d.prompts_per_skill * d.samples_per_prompt
    assert envs == (16 if name == "qwen3-4b-tool-use.toml" else 24)
    assert a.plays_nohint == gbs // envs and a.plays_per_env == "fill_batch"
    from spade_async.loop.cycle import plays_per_env

    # the reference's ceil(global batch / games played): 17 valid of 24 -> 12 plays each
    assert plays_per_env(cfg, envs) == nohint
    assert plays_per_env(cfg, 17) == -(-gbs // 17)
    assert plays_per_env(msgspec.structs.replace(cfg, batch_samples=0), 17) == nohint
    assert (cfg.hint.temperature, cfg.mode, d.samples_per_prompt) == (0.3, "spade", 1)
    assert (d.retries, d.difficulty) == (4, "medium")


def test_a_budget_the_engine_cannot_serve_is_one_line_at_start_and_in_dry_run(tmp_path):
    from spade_async.errors import ConfigError

    with pytest.raises(ConfigError, match=r"agent.max_episode_tokens \(8000\) cannot hold"):
        recipe.load(CONFIGS / "qwen3-8b-games.toml", ["agent.max_episode_tokens=8000"])
    with pytest.raises(ConfigError, match="exceeds the engine's context"):
        recipe.load(
            CONFIGS / "qwen3-8b-games.toml", ['engine.extra_args=["--context-length", "16384"]']
        )
    # the recipe's own budgets fit a 32768 context: 20000 designer tokens + 6000 words
    recipe.load(CONFIGS / "qwen3-8b-games.toml", ['engine.extra_args=["--context-length=32768"]'])
    with pytest.raises(ConfigError, match=r"designer.max_new_tokens \(30000\) \+ a prompt"):
        recipe.load(
            CONFIGS / "qwen3-8b-games.toml",
            ['engine.extra_args=["--context-length=32768"]', "designer.max_new_tokens=30000"],
        )
    out = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "train", str(CONFIGS / "qwen3-8b-games.toml"),
         "--dry-run", "--run-dir", str(tmp_path / "run"), "--set", "agent.max_turn_tokens=40000"],
        capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        timeout=100,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "cannot hold a prompt plus the turn budget" in err[0], err
    assert not (tmp_path / "run").exists()


def test_30b_colocated_alternative_from_its_comment():
    cfg = recipe.load(
        CONFIGS / "qwen3-30b-a3b-games.toml",
        [
            "engine.gpus=[[0,1,2,3],[4,5,6,7]]",
            "placement.trainer_gpus=[0,1,2,3,4,5,6,7]",
            "placement.colocate=true",
            "schedule=sync",
            'engine.extra_args=["--enable-memory-saver"]',
            "engine.mem_fraction_static=0.45",
        ],
    )
    comment = (CONFIGS / "qwen3-30b-a3b-games.toml").read_text()
    assert "--set placement.colocate=true --set schedule=sync" in comment
    plan = placement.launch_plan(cfg, model_dir=cfg.model, run_dir="/runs/x")
    assert [(p.role, p.ranks) for p in plan] == [("engine", 4), ("engine", 4), ("trainer", 8)]
    assert "--enable-memory-saver" in plan[0].argv
    text = placement.format_plan(cfg, plan)
    assert "colocated" in text and "CUDA IPC" in text


def test_spade_train_dry_run_on_this_machine(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a CPU machine, even on a GPU host
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spade_async.cli",
            "train",
            str(CONFIGS / "qwen3-8b-games.toml"),
            "--dry-run",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for name in ("engine-0", "engine-1", "engine-2", "engine-3", "trainer"):
        assert any(line.startswith(name) for line in lines), name
    assert "--nproc-per-node=4" in out.stdout and "--tp-size 1" in out.stdout
    assert any(line.startswith("warning: GPU(s) 0, 1, 2, 3, 4, 5, 6, 7") for line in lines)
    assert not run_dir.exists()


def test_greedy_trained_rollouts_are_refused():
    import pytest

    from spade_async import recipe
    from spade_async.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"temperature = 0 is out of range: must be in \(0, 100\]"
    ):
        recipe.load(None, ["agent.temperature=0", "designer.temperature=0"])


def test_checkpoint_every_zero_means_the_end_only_and_negative_is_one_line():
    """checkpoint_every = 0 divided by zero in the loop (cycle.step_done); now it saves at the
    end only, and a negative value is refused at load."""
    cfg = recipe.load(None, ["checkpoint_every=0"])
    recipe.check(cfg)
    from spade_async.loop.cycle import checkpoint_due

    assert [s for s in range(1, 8) if checkpoint_due(s, 0, 7)] == [7]
    assert [s for s in range(1, 8) if checkpoint_due(s, 3, 7)] == [3, 6, 7]
    with pytest.raises(recipe.ConfigError, match="checkpoint_every = -1"):
        recipe.check(recipe.load(None, ["checkpoint_every=-1"]))
