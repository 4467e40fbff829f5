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

# recipe -> (model dir, engine TP groups, trainer GPUs, KL coefficient)
EXPECTED = {
    "qwen3-4b-games.toml": ("/models/Qwen3-4B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.0),
    "qwen3-4b-tool-use.toml": ("/models/Qwen3-4B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.0),
    "qwen3-8b-games.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-8b-tool-use.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-8b-fixed-pool.toml": ("/models/Qwen3-8B", [[0], [1], [2], [3]], [4, 5, 6, 7], 0.005),
    "qwen3-30b-a3b-games.toml": ("/models/Qwen3-30B-A3B", [[0, 1]], [2, 3, 4, 5, 6, 7], 0.0),
    "qwen3-30b-a3b-tool-use.toml": ("/models/Qwen3-30B-A3B", [[0, 1]], [2, 3, 4, 5, 6, 7], 0.0),
    # 8xH100: the same, with the trainer's optimizer state in host memory (trainer.offload)
    "qwen3-30b-a3b-games-h100.toml": ("/models/Qwen3-30B-A3B", [[0, 1]], [2, 3, 4, 5, 6, 7], 0.0),
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
    assert cfg.agent.temperature == 0.6
    # the reference's optimiser and loss (slime defaults + its recipes' flags)
    assert (tr.loss_agg, tr.weight_decay, tr.betas) == ("seq-mean-token-mean", 0.1, (0.9, 0.98))
    assert (tr.kl_coef, tr.kl_reference) == (
        (0.005, "initial") if "8b" in name else (0.0, "initial")
    )
    if cfg.mode == "fixed_pool":
        assert cfg.agent.plays_nohint == 16
        assert not cfg.designer_enabled and cfg.agent.plays_hint == 0 and cfg.replay_envs == 24
        return
    d = cfg.designer
    assert d.setting == ("tool_use" if "tool-use" in name else "games")
    assert d.skills_per_regen * d.prompts_per_skill * d.samples_per_prompt == 24
    assert (d.temperature, d.max_new_tokens, cfg.regen_interval) == (0.6, 16384, 4)
    assert (cfg.agent.plays_hint, cfg.hint.temperature, cfg.mode) == (16, 0.3, "spade")
    # global batch 192 over 24 environments: 8 no-hint plays each, designer samples first
    assert (cfg.agent.plays_nohint, cfg.batch_samples, d.samples_per_prompt) == (8, 192, 1)
    assert (cfg.hint.max_new_tokens, d.retries, d.difficulty) == (4096, 4, "medium")


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

    with pytest.raises(ConfigError, match="must be > 0"):
        recipe.load(None, ["agent.temperature=0", "designer.temperature=0"])
