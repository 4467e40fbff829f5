"""Out-of-range input across the commands (issue 45): train, its dry run, demo, resume,
report, slurm, eval and plan (flags and cost files) each refuse in one line naming the value
and its range, exit 2: no traceback, no table, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from spade_async.cli.dispatch import main

ROOT = Path(__file__).parents[2]
DEMO = str(ROOT / "configs" / "cpu-demo.toml")
BIG = str(ROOT / "configs" / "qwen3-8b-games.toml")


def _refused(capsys, argv: list[str], line: str) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (argv, out, err)
    assert "Traceback" not in err + out
    banner = argv[0] == "demo"  # the demo says what it is about to run, then loads it
    assert banner or not out.strip(), out  # no table: nothing on stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert line in lines[0], lines[0]
    return lines[0]


SETS = {
    "agent.temperature=nan": "config: agent.temperature = nan is out of range: must be in (0, 100]",
    "memory.queue_size=-1": "config: memory.queue_size = -1 is out of range: must be in [1, ",
    "client.max_concurrency=0": "config: client.max_concurrency = 0 is out of range",
    "engine.external=['http//h:1']": "config: engine.external[0] = 'http//h:1' is out of range",
    "max_staleness=-1": "config: max_staleness = -1 is out of range",
}


@pytest.mark.parametrize("override", list(SETS))
def test_train_dry_run_demo_and_slurm_refuse_in_one_line(capsys, tmp_path, override):
    line = SETS[override]
    run = str(tmp_path / "run")
    _refused(capsys, ["train", DEMO, "--run-dir", run, "--set", override], line)
    _refused(capsys, ["train", DEMO, "--dry-run", "--run-dir", run, "--set", override], line)
    _refused(capsys, ["demo", "--run-dir", run, "--set", override], line)
    _refused(capsys, ["slurm", BIG, "--set", override], line)
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_resume_and_report_refuse_a_saved_config_out_of_range(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[agent]\nmax_turns = 0\n[memory]\nqueue_size = -1\n")
    line = "config: agent.max_turns = 0 is out of range: must be in [1, 1000000]"
    _refused(capsys, ["train", DEMO, "--run-dir", str(run)], line)  # resume
    _refused(capsys, ["report", str(run)], line)
    fixed = "[memory]\nqueue_size = -1\n"
    (run / "config.toml").write_text(fixed)
    _refused(capsys, ["train", DEMO, "--run-dir", str(run)], "memory.queue_size = -1")
    # an override on resume is checked the same way
    (run / "config.toml").write_text("")
    _refused(capsys, ["train", DEMO, "--run-dir", str(run), "--set", "envs.nproc=0"],
             "config: envs.nproc = 0 is out of range")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--n=-1"], "--n = -1 is out of range: must be in [0, "),
        (["--concurrency", "0"], "--concurrency = 0 is out of range: must be in [1, "),
        (["--max-tokens=-5"], "--max-tokens = -5 is out of range"),
        (["--base-url", "localhost:30000"], "--base-url = 'localhost:30000' is out of range"),
    ],
)
def test_eval_flags_are_range_checked(capsys, flags, line):
    _refused(capsys, ["eval", "smollm2-135m-instruct", "--suites", "aime25", *flags], line)


COST_FILES = {
    "zero": ("[gpu.h100-80gb]\nhbm_tb_s = 0\n", "gpu.h100-80gb.hbm_tb_s = 0 is out of range"),
    "negative": ("[model.qwen3-8b]\nparams = -8e9\n", "model.qwen3-8b.params = -8000000000.0"),
    "infinite": ("[gpu.h100-80gb]\nbf16_tflops = inf\n", "bf16_tflops = inf is out of range"),
    "nan": ("[gpu.h100-80gb]\nmemory_gib = nan\n", "memory_gib = nan is out of range"),
    "mistyped": ('[model.qwen3-8b]\nlayers = "36"\n', "layers = '36' is out of range: must be an integer"),
    "fractional": ("[model.qwen3-8b]\nkv_heads = 8.5\n", "kv_heads = 8.5 is out of range"),
    "a bool": ("[gpu.h100-80gb]\nhbm_tb_s = true\n", "hbm_tb_s = True is out of range"),
    "unknown key": ("[gpu.h100-80gb]\nhbm = 3.0\n", "gpu.h100-80gb.hbm: unknown key"),
    "unknown table": ("[gpus.h100]\nhbm_tb_s = 3.0\n", "unknown table [gpus]"),
    "flat": ("gpu = 3\n", "[gpu] holds tables"),
    "active above total": ("[model.qwen3-8b]\nparams = 8e9\nactive_params = 9e9\n",
                           "active_params = 9000000000.0 is out of range: must be <= params"),
    "not TOML": ("[gpu\n", "not valid TOML"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(COST_FILES))
def test_plan_refuses_cost_files_out_of_range(capsys, tmp_path, name):
    text, line = COST_FILES[name]
    costs = tmp_path / "costs.toml"
    costs.write_text(text)
    _refused(capsys, ["plan", BIG, "--throughput", "--costs", str(costs)], line)


def test_plan_refuses_cost_files_that_are_not_text_files(capsys, tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.toml")  # opened for reading it would wait for a writer
    _refused(capsys, ["plan", BIG, "--throughput", "--costs", str(tmp_path / "fifo.toml")],
             "not a plain file")  # fmt: skip
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    _refused(capsys, ["plan", BIG, "--throughput", "--costs", str(tmp_path / "bin.toml")],
             "not UTF-8")  # fmt: skip
    _refused(capsys, ["plan", BIG, "--throughput", "--costs", str(tmp_path / "none.toml")],
             "No such file")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--steps", "0"], "--steps = 0 is out of range: must be in [1, 1000]"),
        (["--steps=-4"], "--steps = -4 is out of range"),
        (["--staleness=-1"], "--staleness = -1 is out of range: must be in [0, 64]"),
        (["--staleness", "0,two"], "--staleness = 'two' is out of range: must be an integer"),
        (["--staleness", ","], "--staleness = ',' is out of range"),
        (["--splits=-2+10"], "--splits = '-2+10' is out of range: must be one of"),
        (["--splits", ""], "--splits = '' is out of range"),
        (["--set", "agent.max_turn_tokens=-1"], "config: agent.max_turn_tokens = -1"),
        (["--set", "max_staleness=-2"], "config: max_staleness = -2 is out of range"),
    ],
)
def test_plan_refuses_flags_out_of_range(capsys, flags, line):
    _refused(capsys, ["plan", BIG, "--throughput", *flags], line)


def test_train_dry_run_refuses_a_negative_sample(capsys):
    _refused(capsys, ["train", BIG, "--dry-run", "--sample-tokens=-5"],
             "--sample-tokens = -5 is out of range: must be 0 or in [1, ")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["corpus", "sample", "embedded", "--seed=-1"], "--seed = -1 is out of range: must be in [0, "),
        (["corpus", "sample", "embedded", "--max-words=-5"], "--max-words = -5 is out of range"),
        (["memory", "ls", "--run", str(ROOT / "tests" / "fixtures" / "demo_run"), "--limit=-1"],
         "--limit = -1 is out of range: must be >= 0"),
    ],
)  # fmt: skip
def test_corpus_and_memory_flags_are_range_checked(capsys, argv, line):
    _refused(capsys, argv, line)
