"""Several nodes: layout checks (one line each), torchrun's rendezvous, the dry-run node
plans and the sbatch script of the multi-node recipes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from spade_async import recipe
from spade_async.cli import main as cli_main
from spade_async.errors import ConfigError
from spade_async.launch.layout import torchrun_rdzv
from spade_async.launch.slurm import sbatch_script

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TWO = str(CONFIGS / "qwen3-8b-games-2node.toml")
FOUR = str(CONFIGS / "qwen3-30b-a3b-games-4node.toml")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["placement.nnodes=2", "placement.node_rank=2", "placement.master_addr='a'"],
            "node_rank = 2",
        ),
        (["placement.nnodes=2"], "needs placement.master_addr"),
        (["placement.nnodes=0"], r"placement.nnodes = 0 is out of range: must be in \[1, "),
        (["placement.master_port=70000"], "master_port"),
        (["engine.external=['http://10.0.0.5:30000']"], "placement.weight_dir"),
        (["engine.external=['localhost:30000']"], "out of range: must be an http.s.://host:port"),
        (["engine.external=['http://h:1', 'http://h:1']", "placement.weight_dir='/x'"], "twice"),
        (["placement.engine_nodes=1", "placement.master_addr='h'"], "engine.kind = 'sglang'"),
    ],
)
def test_disagreeing_layouts_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        recipe.load(None, overrides)
    assert "\n" not in str(err.value)


def test_local_external_engine_needs_no_shared_directory():
    cfg = recipe.load(None, ["engine.external=['http://127.0.0.1:30000']"])
    assert cfg.engine.external == ["http://127.0.0.1:30000"]


def test_torchrun_rendezvous():
    one = recipe.load(None, [])
    assert torchrun_rdzv(one.placement) == ["--standalone"]
    two = recipe.load(FOUR, ["placement.node_rank=1", "placement.master_addr='n0'"])
    args = torchrun_rdzv(two.placement, "job")
    assert args == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=n0:29500",
        "--rdzv-id=job",
    ]
    static = recipe.load(FOUR, ["placement.rdzv_backend='static'"])
    assert "--master-addr=train-node-0" in torchrun_rdzv(static.placement)


def test_dry_run_node_plans(capsys):
    assert cli_main(["train", FOUR, "--dry-run", "--node-rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "this is training node 1" in out and "global ranks 8..15" in out
    assert "--nnodes=2 --node-rank=1 --rdzv-backend=c10d" in out
    assert "controller, engines, router: on training node 0, not here" in out
    assert "sglang_router" not in out and "engine-0" not in out
    assert cli_main(["train", FOUR, "--dry-run", "--node-rank", "0"]) == 0
    out = capsys.readouterr().out
    assert "controller: this node" in out and "sglang_router.launch_router" in out
    assert "--node-rank=0" in out and "HSDP" in out
    assert cli_main(["train", FOUR, "--dry-run", "--node-rank", "2"]) == 2
    assert "node_rank = 2 but nnodes = 2" in capsys.readouterr().err


@pytest.mark.parametrize("path", [TWO, FOUR])
def test_sbatch_script(path):
    cfg = recipe.load(path, [])
    text = sbatch_script(cfg, path, "/shared/run", ["trainer.lr=2e-6"])
    pl = cfg.placement
    assert f"#SBATCH --nodes={pl.engine_nodes + pl.nnodes}" in text
    assert "#SBATCH --ntasks-per-node=1" in text
    assert text.count("--kill-on-bad-exit=1") == 2  # engine nodes' and training nodes' sruns
    # engine nodes first, the controller (node-rank 0) on the first training node
    assert f'ENGINE_HOSTS=("${{HOSTS[@]:0:{pl.engine_nodes}}}")' in text
    assert f'TRAIN_HOSTS=("${{HOSTS[@]:{pl.engine_nodes}:{pl.nnodes}}}")' in text
    assert 'MASTER_ADDR="${TRAIN_HOSTS[0]}"' in text
    assert text.count("python -m sglang.launch_server") == pl.engines_per_node
    tp = pl.gpus_per_node // pl.engines_per_node
    assert f"--tp-size {tp}" in text and "--set trainer.lr=2e-6" in text
    assert "wait -n" in text and "scancel" in text
    bash = shutil.which("bash")
    if bash:
        subprocess.run([bash, "-n"], input=text, text=True, check=True)


def test_slurm_refuses_a_one_node_recipe(capsys):
    assert cli_main(["slurm", str(CONFIGS / "cpu-demo.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs on one node" in err[0]


@pytest.mark.parametrize(
    ("path", "single"), [(TWO, "qwen3-8b-games.toml"), (FOUR, "qwen3-30b-a3b-games.toml")]
)
def test_node_recipes_keep_the_single_node_hyper_parameters(path, single):
    many, one = recipe.load(path), recipe.load(CONFIGS / single)
    # every method hyper-parameter of the trainer, not only lr and KL (the 4-node recipe
    # once fell back to loss_agg token, weight decay 0 and betas (0.9, 0.999))
    for f in ("lr", "kl_coef", "kl_reference", "loss_agg", "weight_decay", "betas", "eps",
              "clip_low", "clip_high", "tis_cap", "grad_clip", "temperature",
              "old_logprobs", "entropy_coef", "warmup_steps", "total_steps"):  # fmt: skip
        assert getattr(many.trainer, f) == getattr(one.trainer, f), f
    assert many.designer == one.designer and many.agent == one.agent
    assert many.rewards == one.rewards and many.hint == one.hint and many.corpus == one.corpus
    assert (many.model, many.regen_interval, many.batch_samples, many.max_steps) == (
        one.model,
        one.regen_interval,
        one.batch_samples,
        one.max_steps,
    )
    assert many.engine.router and many.engine.kind == "sglang" and many.engine.gpus == []
    assert many.placement.weight_push == "distributed"
