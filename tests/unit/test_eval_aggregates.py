"""Table columns, the paper's composite and its interval, --compare: hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from spade_async.eval.metrics import (
    COMPOSITE,
    PAPER_COLUMNS,
    Column,
    bootstrap,
    column_value,
    suite_metrics,
)
from spade_async.eval.types import Results, Sample, Sampling, SuiteResult


def sample(
    pid: str, score: float, k: int = 0, extracted: str | None = None, prompt: str = ""
) -> Sample:
    return Sample(id=pid, sample=k, prompt=prompt or f"question {pid.split('/')[0]}", completion="",
                  answer="", extracted=extracted, score=score)  # fmt: skip


def rg_run(winning_tasks: set[int]) -> list[Sample]:
    """4 tasks x 8 episodes; a task's episodes all win or all lose (they share a generator)."""
    return [
        sample(f"task{t}/{e}", 1.0 if t in winning_tasks else 0.0)
        for t in range(4)
        for e in range(8)
    ]


def test_rg_interval_resamples_tasks_not_episodes():
    """B wins every episode of 2 of 4 tasks, A none: B - A = 0.5. Resampling the 32 episodes as
    independent gives about 0.5 +- 1.96*sqrt(0.25/32) = [0.33, 0.67]; resampling the 4 tasks
    draws 0..4 winning tasks, and 0 or 4 of 4 each have probability 1/16 > 2.5%: [0, 1]."""
    a, b = rg_run(set()), rg_run({0, 1})
    clustered = bootstrap({"RG:Logic": (Column("rg_logic", a), Column("rg_logic", b))})["RG:Logic"]
    assert clustered["value"] == 0.5 and clustered["clusters"] == 4
    assert clustered["ci95"] == [0.0, 1.0]
    # the same scores with every episode its own cluster (what the old bootstrap did)
    flat = bootstrap({"x": (Column("aime25", a), Column("aime25", b))})["x"]
    assert flat["value"] == 0.5 and flat["clusters"] == 32
    assert 0.28 < flat["ci95"][0] < 0.38 and 0.62 < flat["ci95"][1] < 0.72


def ace_run(step_wins: int, turn_wins: int) -> list[Sample]:
    return [sample(f"agent_multi_step_{i}", float(i < step_wins)) for i in range(20)] + [
        sample(f"agent_multi_turn_{i}", float(i < turn_wins)) for i in range(30)
    ]


def test_acebench_agent_is_the_mean_of_its_two_halves_not_a_pooled_mean():
    """A: 10/20 multi_step, 0/30 multi_turn -> Agent (0.5 + 0)/2 = 0.25 (pooled: 10/50 = 0.2).
    B: 10/20, 30/30 -> 0.75 (pooled 0.8). B - A = 0.5 (pooled would say 0.6)."""
    a, b = Column("acebench_agent", ace_run(10, 0)), Column("acebench_agent", ace_run(10, 30))
    assert column_value(a) == 0.25 and column_value(b) == 0.75
    row = bootstrap({"ACEBench-A": (a, b)})["ACEBench-A"]
    assert row["value"] == pytest.approx(0.5, abs=1e-12) and row["metric"] == "agent"
    # multi_step is identical in both runs, multi_turn differs in every problem: no spread
    assert row["ci95"] == pytest.approx([0.5, 0.5], abs=1e-12)


def test_composite_is_the_mean_of_the_eight_columns_with_a_joint_interval():
    diffs = {}
    cols = {}
    for i, label in enumerate(COMPOSITE):
        suite = PAPER_COLUMNS[label]
        ids = [f"t{j}/0" if suite.startswith("rg_") else f"p{j}" for j in range(10)]
        a = [sample(pid, 0.0) for pid in ids]
        b = [sample(pid, float(j < i + 1)) for j, pid in enumerate(ids)]  # (i+1)/10 better
        cols[label] = (Column(suite, a), Column(suite, b))
        diffs[label] = (i + 1) / 10
    rows = bootstrap(cols, COMPOSITE, iters=4000)
    for label, d in diffs.items():
        assert rows[label]["value"] == pytest.approx(d, abs=1e-12)
    comp = rows["composite"]
    assert comp["value"] == pytest.approx(sum(diffs.values()) / 8, abs=1e-12)  # 0.45
    lo, hi = comp["ci95"]
    assert lo < comp["value"] < hi
    # the mean of 8 independent columns is tighter than any one column's interval
    assert hi - lo < min(
        r["ci95"][1] - r["ci95"][0] for k, r in rows.items() if k != "composite" and r["value"] < 1
    )
    assert bootstrap({k: cols[k] for k in COMPOSITE[:7]}, COMPOSITE).get("composite") is None


def test_pairs_with_different_content_are_an_error():
    a = [sample("p1", 1.0, prompt="What is 2+2?"), sample("p2", 0.0)]
    b = [sample("p1", 1.0, prompt="What is 3+3?"), sample("p2", 1.0)]
    with pytest.raises(ValueError, match=r"suite aime25: problem 'p1' has a different prompt"):
        bootstrap({"AIME-25": (Column("aime25", a), Column("aime25", b))})


def test_majority_tie_goes_to_the_lowest_sample_index_in_any_order():
    """2 votes "B" (samples 0, 3; wrong) vs 2 votes "A" (samples 1, 2; right): a tie that
    "first seen" broke by finish order. Sample 0's answer wins whatever the order: 0.0."""
    s = [sample("p", 0.0, 0, "B"), sample("p", 1.0, 1, "A"), sample("p", 1.0, 2, "A"),
         sample("p", 0.0, 3, "B")]  # fmt: skip
    for order in (s, [s[1], s[0], s[2], s[3]], s[::-1]):
        assert suite_metrics(order, k=4)["maj@4"] == 0.0
    assert suite_metrics([s[1], s[0], s[2]], k=3)["maj@3"] == 1.0  # A has the majority


def test_bfcl_column_equals_the_suite_overall():
    from spade_async.eval.suites import bfcl_lib, make_suite

    suite = make_suite("bfcl_v4")
    suite.sizes = bfcl_lib.category_sizes()
    samples = []
    for i, cat in enumerate(bfcl_lib.ALL):
        if cat in ("simple_java", "live_parallel"):
            continue  # not evaluated: 0 at full size
        samples += [sample(f"{cat}_{j}", float(j < i % 4)) for j in range(4)]
    want = suite.metrics(samples, 1)["overall"]
    assert column_value(Column("bfcl_v4", samples, suite.sizes)) == pytest.approx(want, abs=1e-12)
    assert 0 < want < 0.6


def _write_run(root: Path, runs: dict[str, list[Sample]]) -> Path:
    from spade_async.eval.runner import write_samples

    root.mkdir(parents=True, exist_ok=True)
    suites = {}
    for name, samples in runs.items():
        write_samples(root / f"{name}.jsonl", samples)
        suites[name] = SuiteResult(suite=name, metrics=suite_metrics(samples, k=1), n_problems=len(samples),
                                   samples=len(samples), k=1, settings=Sampling(), model="m",
                                   policy_version=None)  # fmt: skip
    res = Results(model=root.name, policy_version=None, complete=True, suites=suites)
    (root / "results.json").write_bytes(msgspec.json.encode(res))
    return root / "results.json"


def test_compare_cli_reports_columns_and_composite(tmp_path, capsys):
    from spade_async.eval.cli import main

    a_runs, b_runs = {}, {}
    for _i, label in enumerate(COMPOSITE):
        suite = PAPER_COLUMNS[label]
        ids = [f"t{j}/0" if suite.startswith("rg_") else f"p{j}" for j in range(6)]
        a_runs[suite] = [sample(pid, 0.0) for pid in ids]
        b_runs[suite] = [sample(pid, float(j % 2)) for j, pid in enumerate(ids)]  # +0.5
    a_runs["acebench_agent"], b_runs["acebench_agent"] = ace_run(10, 0), ace_run(10, 30)
    pa, pb = _write_run(tmp_path / "base", a_runs), _write_run(tmp_path / "trained", b_runs)
    assert main(["--compare", str(pa), str(pb), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["columns"]
    assert out["composite"]["value"] == pytest.approx(0.5, abs=1e-12)
    assert out["composite"]["a"] == 0.0 and out["composite"]["b"] == pytest.approx(0.5)
    assert out["ACEBench-A"]["value"] == pytest.approx(0.5, abs=1e-12)
    assert out["RG:Math"]["clusters"] == 6


def test_compare_cli_names_a_content_mismatch(tmp_path):
    import subprocess
    import sys

    pa = _write_run(tmp_path / "a", {"aime25": [sample("p1", 1.0, prompt="x")]})
    pb = _write_run(tmp_path / "b", {"aime25": [sample("p1", 1.0, prompt="y")]})
    r = subprocess.run([sys.executable, "-m", "spade_async.cli", "eval", "--compare", str(pa), str(pb)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "problem 'p1' has a different prompt" in lines[0], r.stderr


def test_paper_preset_runs_the_table_and_prints_the_composite(tmp_path, monkeypatch, capsys):
    """--paper evaluates exactly the paper's ten columns; the composite of the eight comes with
    its interval (generation replaced by saved hand-made samples)."""
    from spade_async.eval import cli

    asked = {}

    async def fake_generate(args, names, out, data):
        asked["names"] = names
        runs = {PAPER_COLUMNS[label]: [sample(f"t{j}/0" if "rg" in label else f"p{j}", float(j < 3))
                                       for j in range(4)] for label in COMPOSITE}  # fmt: skip
        runs["bfcl_v4"] = [sample("simple_python_0", 1.0), sample("multi_turn_base_0", 0.0)]
        runs["acebench_agent"] = ace_run(10, 15)
        return msgspec.json.decode(_write_run(out, runs).read_bytes(), type=Results)

    monkeypatch.setattr(cli, "_generate", fake_generate)
    monkeypatch.setattr(cli, "_check_data", lambda names, data: None)
    assert cli.main(["m", "--paper", "--out", str(tmp_path / "o"), "--json"]) == 0
    assert asked["names"] == list(PAPER_COLUMNS.values()) and len(asked["names"]) == 10
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    comp = rec["paper"]["composite"]
    assert comp["value"] == 0.75 and comp["columns"] == COMPOSITE
    assert comp["ci95"][0] <= 0.75 <= comp["ci95"][1]
    assert rec["paper"]["ACEBench-A"]["value"] == 0.5  # (10/20 + 15/30) / 2


@pytest.mark.parametrize(("argv", "needle"), [
    (["m", "--paper", "--suites", "aime25", "--out", "x"], "drop --suites"),
    (["m", "--paper"], "--paper needs --out"),
    (["m", "--suites", "aime_25"], "did you mean 'aime25'"),
])  # fmt: skip
def test_paper_and_suite_usage_errors_are_one_line(argv, needle):
    from spade_async.errors import SpadeError
    from spade_async.eval.cli import main

    with pytest.raises(SpadeError, match=needle):
        main(argv)
