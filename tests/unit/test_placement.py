"""Placement: validation (one-line errors), GPU discovery without CUDA, the launch plan."""

from __future__ import annotations

import json
import stat

import msgspec
import pytest

from spade_async import cli, placement, recipe
from spade_async.errors import ConfigError

GPU8 = [
    "engine.kind=sglang",
    "engine.gpus=[[0], [1], [2], [3]]",
    "placement.trainer_gpus=[4, 5, 6, 7]",
    "model=/models/Qwen3-8B",
]


def _load(*extra: str):
    return recipe.load(None, [*GPU8, *extra])


def _error(*extra: str) -> str:
    with pytest.raises(ConfigError) as exc:
        _load(*extra)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_disaggregated_placement_is_valid():
    cfg = _load()
    assert cfg.placement.trainer_gpus == [4, 5, 6, 7]
    assert not cfg.placement.colocate
    assert placement.requested_gpus(cfg) == list(range(8))


def test_overlap_without_colocate_is_one_line():
    msg = _error("placement.trainer_gpus=[3, 4, 5, 6]")
    assert "GPU(s) 3" in msg and "placement.colocate = true" in msg


def test_overlap_with_colocate_needs_memory_saver_then_passes():
    shared = ["placement.trainer_gpus=[0, 1, 2, 3]", "placement.colocate=true"]
    assert "--enable-memory-saver" in _error(*shared, "schedule=sync")
    # colocated engines cannot overlap training
    assert "schedule = 'sync'" in _error(*shared, "placement.release_memory=false")
    shared.append("schedule=sync")
    cfg = _load(*shared, 'engine.extra_args=["--enable-memory-saver"]')
    assert cfg.placement.colocate and cfg.placement.release_memory
    cfg = _load(*shared, "placement.release_memory=false")  # no release: no saver needed
    assert not cfg.placement.release_memory


def test_gpu_used_by_two_engines():
    assert "GPU 1 is used by engines 0 and 1" in _error("engine.gpus=[[0, 1], [1, 2]]")
    assert "GPU 0 is used twice" in _error("engine.gpus=[[0, 0]]")


def test_cpu_engines_with_gpus_and_sglang_without():
    msg = _error("engine.kind=cpu")
    assert "engine.kind = 'cpu'" in msg and "remove engine.gpus" in msg
    assert "needs engine.gpus" in _error("engine.gpus=[]")
    assert "colocate = true needs engine.kind = 'sglang'" in _error(
        "engine.kind=cpu", "engine.gpus=[]", "placement.colocate=true"
    )


def test_trainer_gpu_list_and_ranks_checked():
    assert "distinct GPU ids" in _error("placement.trainer_gpus=[4, 4]")
    bad = _error("placement.trainer_gpus=[-1]")
    assert "placement.trainer_gpus[0] = -1 is out of range" in bad
    assert "cpu_ranks" in _error("placement.cpu_ranks=0")


def test_tp_size_must_divide_attention_heads(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"num_attention_heads": 32, "num_key_value_heads": 8})
    )
    ok = _load(f"model={model}", "engine.gpus=[[0, 1], [2, 3]]")
    assert [len(g) for g in ok.engine.gpus] == [2, 2]
    msg = _error(f"model={model}", "engine.gpus=[[0, 1, 2]]")
    assert "tensor-parallel size 3" in msg and "32 attention heads" in msg
    assert "1 or 2 or 4 or 8" in msg


def test_nonexistent_gpus_fail_with_fake_gpu_count():
    cfg = _load()
    placement.check_devices(cfg, visible=range(8), source="fake")
    with pytest.raises(ConfigError) as exc:
        placement.check_devices(cfg, visible=range(4), source="fake")
    msg = str(exc.value)
    assert "GPU(s) 4, 5, 6, 7" in msg and "GPUs 0, 1, 2, 3" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="has no GPU"):
        placement.check_devices(cfg, visible=[], source="fake")


def test_visible_gpus_from_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert placement.visible_gpus()[0] == [0, 1, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert placement.visible_gpus()[0] == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,-1,3")  # CUDA stops at the first invalid id
    assert placement.visible_gpus()[0] == [2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1b")
    with pytest.raises(ConfigError, match="nvidia-smi indices"):
        placement.visible_gpus()


def test_visible_gpus_from_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert placement.visible_gpus()[0] == []  # no nvidia-smi: a CPU-only machine
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aa)'\n"
        "echo '  MIG 3g.40gb     Device  0: (UUID: MIG-bb)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cc)'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert placement.visible_gpus() == ([0, 1], "nvidia-smi -L")


def test_trainer_process_follows_placement_without_side_effects(tmp_path):
    cfg = recipe.load(None, ["placement.cpu_ranks=2", "placement.trainer_threads=3"])
    proc = placement.trainer_process(cfg, "/m", tmp_path / "run")
    assert "--nproc-per-node=2" in proc.cmd
    assert proc.cmd[proc.cmd.index("--threads") + 1] == "3"
    assert proc.env == {"CUDA_VISIBLE_DEVICES": ""}  # CPU ranks never grab a GPU
    assert not (tmp_path / "run").exists()


def test_cpu_plan():
    cfg = recipe.load(None, ["engine.count=2", "engine.threads=1"])
    plan = placement.launch_plan(cfg, model_dir="/m", run_dir="/r")
    assert [p.name for p in plan] == ["engine-0", "engine-1", "trainer"]
    engine = plan[0]
    assert engine.gpus == [] and engine.env == {"OMP_NUM_THREADS": "1"}
    assert "spade_async.generation.server" in engine.argv
    assert engine.argv[engine.argv.index("--model") + 1] == "/m"
    assert plan[2].ranks == 1 and "--socket" in plan[2].argv
    assert plan[2].argv[plan[2].argv.index("--socket") + 1] == "/r/trainer.sock"


def test_gpu_plan_and_format():
    cfg = _load("engine.base_port=30000")
    plan = placement.launch_plan(cfg, model_dir="/models/Qwen3-8B", run_dir="/r")
    assert [(p.role, p.gpus, p.ranks) for p in plan] == [
        ("engine", [0], 1),
        ("engine", [1], 1),
        ("engine", [2], 1),
        ("engine", [3], 1),
        ("trainer", [4, 5, 6, 7], 4),
    ]
    e3 = plan[3].argv
    assert "sglang.launch_server" in e3 and e3[e3.index("--port") + 1] == "30003"
    assert plan[3].env["CUDA_VISIBLE_DEVICES"] == "3"
    assert plan[4].env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    decoded = msgspec.json.decode(plan[4].argv[plan[4].argv.index("--config-json") + 1])
    assert decoded["lr"] == cfg.trainer.lr
    text = placement.format_plan(cfg, plan, ["GPU(s) 0 are not present here"])
    assert "disaggregated" in text and "4, 5, 6, 7" in text
    assert "--nproc-per-node=4" in text and "--tp-size 1" in text
    assert text.splitlines()[-1] == "warning: GPU(s) 0 are not present here"


def test_dry_run_warns_and_creates_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    text = placement.describe(_load(), tmp_path / "run")
    assert "warning: GPU(s) 2, 3, 4, 5, 6, 7 are not present here" in text
    assert "warning: model directory '/models/Qwen3-8B' is not on this machine" in text
    assert not (tmp_path / "run").exists()


def test_cli_overlap_is_one_line_exit_2(tmp_path, capsys):
    toml = tmp_path / "r.toml"
    toml.write_text(
        'model = "/models/Qwen3-8B"\n[engine]\nkind = "sglang"\ngpus = [[0], [1]]\n'
        "[placement]\ntrainer_gpus = [1, 2]\n"
    )
    code = cli.main(["train", str(toml), "--dry-run", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "GPU(s) 1" in err
    assert not (tmp_path / "run").exists()


def test_cli_missing_gpus_exit_2_before_the_run_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    toml = tmp_path / "r.toml"
    toml.write_text('[engine]\nkind = "sglang"\ngpus = [[0]]\n')
    code = cli.main(["train", str(toml), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "has no GPU" in err
    assert not (tmp_path / "run").exists()


def test_dry_run_of_a_run_directory_shows_the_resume(tmp_path, monkeypatch):
    from spade_async.rundir import RunDir

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    cfg = _load()
    rd = RunDir(tmp_path / "run").create()
    rd.write_config(cfg)
    (rd.checkpoint(7)).mkdir()
    (rd.checkpoint(7) / "DONE").write_text("")
    rd.hf.mkdir()
    text = placement.describe(recipe.load(rd.config), rd.root)
    assert f"--load {rd.checkpoint(7)}" in text  # trainer resumes from the checkpoint
    assert f"--model-path {rd.hf}" in text  # engines serve the checkpoint's export
    assert "GPU(s)" not in text  # all eight present


def test_weight_push_follows_the_placement():
    from spade_async.loop.runtime import push_kwargs

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"]
    cfg = _load()
    assert placement.push_mode(cfg) == "distributed"
    kw = push_kwargs(cfg, urls)
    assert kw["mode"] == "distributed" and kw["master_port"] > 0
    assert kw["master_address"] == "127.0.0.1"
    assert kw["engines"][0] == "http://127.0.0.1:1#tp=1"
    assert kw["dtype"] == ""  # SGLang's --dtype auto, unless extra_args name one
    assert push_kwargs(_load("engine.extra_args=['--dtype', 'bfloat16']"), urls)["dtype"] == (
        "bfloat16"
    )
    tp2 = _load("engine.gpus=[[0, 1], [2, 3]]")
    assert push_kwargs(tp2, urls[:2])["engines"] == [
        "http://127.0.0.1:1#tp=2", "http://127.0.0.1:2#tp=2"]
    colocated = _load("placement.trainer_gpus=[0, 1, 2, 3]", "placement.colocate=true",
                      "schedule=sync", "placement.release_memory=false")
    assert placement.push_mode(colocated) == "tensor"
    assert push_kwargs(colocated, urls)["engines"][1] == "http://127.0.0.1:2#tp=1;gpus=1"
    cpu = recipe.load(None, [])
    assert placement.push_mode(cpu) == "disk"
    assert push_kwargs(cpu, urls[:1]) == {"engines": urls[:1], "mode": "disk", "dtype": "float32"}
    assert placement.push_mode(_load("placement.weight_push=disk")) == "disk"


def test_weight_push_contradictions_are_one_line():
    assert "needs engine.kind = 'sglang'" in _error(
        "engine.kind=cpu", "engine.gpus=[]", "placement.weight_push=distributed")
    assert "give the trainer GPUs" in _error(
        "placement.trainer_gpus=[]", "placement.weight_push=distributed")
    assert placement.push_mode(_load("placement.trainer_gpus=[]")) == "disk"
    assert "needs placement.colocate = true" in _error("placement.weight_push=tensor")
    with pytest.raises(ConfigError, match="weight_push"):
        _load("placement.weight_push=ipc")


def test_plan_names_the_weight_path():
    text = placement.format_plan(_load(), [])
    assert "NCCL broadcast" in text


def test_cpu_core_lists_checked():
    for key in ("engine.cpus", "placement.trainer_cpus", "placement.controller_cpus"):
        msg = _error(f"{key}=[0, 0]")
        assert key in msg and "distinct CPU core ids" in msg
        assert key in _error(f"{key}=[-1]")
    assert _load("placement.controller_cpus=[0]").placement.controller_cpus == [0]
