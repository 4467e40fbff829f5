"""spade report: its data functions on a recorded run directory (tests/fixtures/demo_run, a
3-step configs/cpu-demo.toml run with the tiny model), the page, and bad input."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from spade_async.cli import main as spade
from spade_async.memory.records import Origin, make_record
from spade_async.memory.store import MemoryStore
from spade_async.report import data as D
from spade_async.report.page import render
from spade_async.telemetry.phases import phase_shares

FIXTURE = Path(__file__).parents[1] / "fixtures" / "demo_run"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def run_copy(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst)
    return dst


def test_the_fixture_loads_whole():
    run = D.load_run(FIXTURE)
    assert run.missing == [], run.missing
    assert [r["step"] for r in run.steps] == [1, 2, 3]
    assert len(run.episodes) == len(_lines(FIXTURE / "episodes" / "records.jsonl"))
    assert run.replay.share == 1.0 and run.replay.checked == len(run.episodes)


def test_series_follow_the_step_records():
    run = D.load_run(FIXTURE)
    steps = [r for r in _lines(FIXTURE / "metrics.jsonl") if r["kind"] == "step"]
    agent = D.rewards_by_role(run)["agent"]
    assert agent == ([1, 2, 3], [r["reward/agent_mean"] for r in steps])
    kl = D.mismatch(run)["KL(engine || trainer)"]
    assert kl[0] == [r["step"] for r in steps if "train/mismatch_kl" in r] and kl[0]
    assert D.throughput(run)["agent"][1] == [r["tokens_per_s/agent"] for r in steps]
    last = steps[-1]
    outcomes = D.designer_outcomes(run)
    assert outcomes["valid"] == last.get("designer/stage/ok", 0)
    assert outcomes["rejected: syntax"] == last["designer/stage/syntax"]
    assert outcomes["retried"] == last["designer/retries"]
    ov = D.overlap(run)
    bound = last["busy_s/engine"] + last["busy_s/env_pool"] + last["busy_s/trainer"]
    assert math.isclose(ov["sync_bound_s"], bound) and ov["wall_s"] == last["time/elapsed_s"]
    assert math.isclose(ov["overlap"], bound / last["time/elapsed_s"])


def test_skill_windows_recompute_from_the_raw_records():
    """Each (skill, window) cell holds one no-hint win rate (mean reward, the recipe's
    rewards.win_rate) per environment played in it, recomputed here from the JSON lines."""
    run = D.load_run(FIXTURE)
    skills = {r.id: r.skill or "unspecified" for r in run.memory}
    w = int(run.config["regen_interval"])
    plain, hinted = defaultdict(list), defaultdict(list)
    for e in _lines(FIXTURE / "episodes" / "records.jsonl"):
        if e["status"] in ("env_error", "engine_error", "timeout"):
            continue
        (hinted if e["hinted"] else plain)[(e["env_id"], e["step"] // w)].append(e["reward"])
    want = defaultdict(list)
    want_regret = defaultdict(list)
    for key in sorted(plain):
        xs = plain[key]
        want[(skills[key[0]], key[1])].append(sum(xs) / len(xs))
        if hinted[key]:
            h = hinted[key]
            want_regret[(skills[key[0]], key[1])].append(
                max(0.0, sum(h) / len(h) - sum(xs) / len(xs))
            )
    got = D.skill_windows(run)
    flat = {(s, k): sorted(c["win_rate"]) for s, cells in got.items() for k, c in cells.items()}
    assert flat == {k: sorted(v) for k, v in want.items()}
    flat_r = {(s, k): sorted(c["regret"]) for s, cells in got.items() for k, c in cells.items()}
    for k, v in want_regret.items():
        assert flat_r[k] == pytest.approx(sorted(v), abs=1e-12)
    assert any(v > 0 for vs in flat.values() for v in vs), "the fixture has wins to show"


def test_phase_shares_arithmetic():
    prev = {"time/elapsed_s": 10.0, "busy_s/engine": 5.0, "busy_s/env_pool": 1.0,
            "busy_s/trainer": 2.0, "busy_s/train": 1.5, "busy_s/push": 0.5}  # fmt: skip
    rec = {"time/elapsed_s": 20.0, "busy_s/engine": 13.0, "busy_s/env_pool": 3.0,
           "busy_s/trainer": 6.0, "busy_s/train": 4.5, "busy_s/push": 1.0}  # fmt: skip
    s = phase_shares(rec, prev)
    assert s["engines"] == pytest.approx({"generation": 0.8, "weight push": 0.05, "idle": 0.15})
    assert s["sandbox pool"] == pytest.approx({"env execution": 0.2, "idle": 0.8})
    # trainer: 3.0 s training + 0.5 s push of 4.0 s busy: 0.5 s checkpoint/other
    assert s["trainer"] == pytest.approx(
        {"training": 0.3, "weight push": 0.05, "checkpoint, other": 0.05, "idle": 0.6}
    )
    old = {"time/elapsed_s": 10.0, "busy_s/engine": 4.0, "busy_s/trainer": 2.0}  # an older run
    assert phase_shares(old)["trainer"] == pytest.approx({"busy (unsplit)": 0.2, "idle": 0.8})
    assert phase_shares({"busy_s/engine": 1.0}) == {}


def test_archive_sizes_and_top_regret_match_memory():
    run = D.load_run(FIXTURE)
    sizes = D.archive_sizes(run)
    valid = defaultdict(int)
    for r in run.memory:
        if r.status == "valid":
            valid[r.skill or "unspecified"] += 1
    assert {k: v[1][-1] for k, v in sizes.items()} == dict(valid)
    top = D.top_regret(run)
    regrets = [r.stats.regret for r in top]
    assert regrets == sorted(regrets, reverse=True) and all(r.stats.regret_updates for r in top)


def test_page_is_self_contained_and_shows_every_section():
    run = D.load_run(FIXTURE)
    page = render(run)
    for title in ("Rewards by role", "Where the time goes", "Train/inference mismatch",
                  "Environment archive", "Held-out evaluation", "Episode replay"):  # fmt: skip
        assert f"<h2>{title}</h2>" in page
    assert page.count("<svg") >= 9
    assert "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "nothing fetched"
    assert "100.0%</b> of 60 episode(s) replay exactly" in page
    assert "overlap factor" in page
    top = D.top_regret(run)[0]
    assert html.escape(top.code.splitlines()[-1].strip()) in page  # its code is shown


def test_cli_writes_the_page(run_copy, capsys):
    assert spade(["report", str(run_copy)]) == 0
    page = (run_copy / "report" / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "wrote" in capsys.readouterr().out


def test_lineage_and_eval_and_compare(run_copy, tmp_path):
    with MemoryStore(run_copy / "memory.lmdb") as store:
        shown = [r.id for r in list(store.records())[:2]]
        code = "class NewEnv:\n    def reset(self, seed=None):\n        return 'x', {}\n"
        rec = make_record(code, origin=Origin(kind="designer", policy_version=1), valid=True,
                          stage="ok", skill="Opt<script>$x^{$", env_class="A<b>Env",
                          shown=shown + ["f" * 64])  # fmt: skip
        store.put(rec)
    with open(run_copy / "metrics.jsonl", "a") as f:
        for v, score in ((0, 0.25), (2, 0.5)):
            f.write(json.dumps({"step": v, "time": 0, "kind": "eval", "eval/policy_version": v,
                                "eval/countdown/avg@1": score}) + "\n")  # fmt: skip
    run = D.load_run(run_copy)
    lin = D.lineage(run)
    assert [r.id for r, _ in lin] == [rec.id]
    assert [getattr(x, "id", x) for x in lin[0][1]] == shown + ["f" * 64]
    assert D.eval_table(run) == {"countdown/avg@1": {0: 0.25, 2: 0.5}}
    page = render(run)
    assert "(not in memory)" in page and shown[0][:12] in page and "v2" in page
    # run-supplied text is escaped (HTML) and never mathtext (figures)
    i = page.find("<script")
    assert i < 0, page[i - 300 : i + 50]
    assert "Opt&lt;script&gt;$x^{$" in page, [m.start() for m in re.finditer("Opt&lt;", page)]
    assert "A&lt;b&gt;Env" in page
    assert "could not be drawn" not in page
    other = D.load_run(FIXTURE)
    rows = D.compare_rows(run, other)
    agent = next(r for r in rows if r["metric"] == "agent reward (mean)")
    vals = [x for _, x in [D.series(run, "reward/agent_mean")]][0]
    mean, lo, hi = agent["a"]
    assert math.isclose(mean, sum(vals) / len(vals)) and lo <= mean <= hi
    out = tmp_path / "cmp"
    assert spade(["report", str(run_copy), "--compare", str(FIXTURE), "--out", str(out)]) == 0
    assert "Compared with" in (out / "index.html").read_text()


def test_partial_run_renders_what_is_there(run_copy, capsys):
    """Killed mid-step: the last step record torn in half, no memory, no replay check."""
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    last_step = max(i for i, x in enumerate(lines) if b'"kind":"step"' in x)
    metrics.write_bytes(b"".join(lines[:last_step]) + lines[last_step][:100])
    shutil.rmtree(run_copy / "memory.lmdb")
    (run_copy / "episodes" / "replay.json").unlink()
    assert spade(["report", str(run_copy)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    page = (run_copy / "report" / "index.html").read_text()
    assert "Missing or partial" in page
    assert "steps 3-3: not run (partial run)" in page
    assert "memory.lmdb: absent" in page and "unreadable line(s) skipped" in page
    assert "replay not checked yet" in page


def test_older_run_and_damaged_files(run_copy, capsys):
    """A run from before phase meters, mismatch and episode records; a corrupt memory."""
    metrics = run_copy / "metrics.jsonl"
    recs = _lines(metrics)
    for r in recs:
        for k in ("busy_s/train", "idle_s/train", "busy_s/push", "idle_s/push",
                  "train/mismatch_kl", "train/mismatch_max"):  # fmt: skip
            r.pop(k, None)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    shutil.rmtree(run_copy / "episodes")
    (run_copy / "memory.lmdb" / "data.mdb").write_bytes(b"not an lmdb file" * 100)
    assert spade(["report", str(run_copy)]) == 2  # damaged memory: the page, and one line
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "--repair" in err
    page = (run_copy / "report" / "index.html").read_text()
    assert "not split into training and weight push" in page
    assert "mean |Δ log p|" in page and "KL(engine || trainer)" not in page  # gap only
    assert "memory.lmdb: unreadable" in page and "episodes/records.jsonl: absent" in page
    assert "all skills together, from the step records" in page  # the per-skill fallback
    run = D.load_run(run_copy)
    cells = D.step_windows(run)["all skills"]
    steps = [r for r in recs if r["kind"] == "step"]
    assert sorted(v for c in cells.values() for v in c["win_rate"]) == sorted(
        v for r in steps for v in r["win_rate/values"]
    )


def test_no_run_directory_is_exit_2(tmp_path, capsys):
    assert spade(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    assert spade(["report", str(tmp_path / "empty")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert spade(["report", str(FIXTURE), "--compare", str(tmp_path / "empty")]) == 2


def test_importance_weight_spread(run_copy):
    metrics = run_copy / "metrics.jsonl"
    recs = _lines(metrics)
    for r in recs:
        if r["kind"] == "step":
            r["train/is_weight_mean"], r["train/is_weight_sq"] = 1.0, 1.0 + 0.04 * r["step"]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    xs, ys = D.staleness(D.load_run(run_copy))["IS weight std (uncapped)"]
    assert xs == [1, 2, 3] and ys == pytest.approx([0.2 * math.sqrt(s) for s in xs])
