"""``spade eval`` end to end on the embedded SmolLM2 and the CPU engine."""

import json
import subprocess
import sys
import time

import pytest


def _spade_eval(tmp_path, suites: str, limit: int, max_tokens: int) -> tuple[dict, float]:
    out = tmp_path / "eval"
    argv = [sys.executable, "-m", "spade_async.cli", "eval", "smollm2-135m-instruct",
            "--suites", suites, "--n", "1", "--limit", str(limit), "--max-tokens", str(max_tokens),
            "--out", str(out), "--json", "--engine-threads", "1"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads((out / "results.json").read_text()) == res
    for name in suites.split(","):
        lines = (out / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == limit
        assert all(0.0 <= json.loads(x)["score"] <= 1.0 for x in lines)
        assert res["suites"][name]["n_problems"] == limit
    return res, seconds


def test_spade_eval_small_end_to_end(tmp_path):
    res, _ = _spade_eval(tmp_path, "aime25", limit=1, max_tokens=16)
    assert res["model"] == "smollm2-135m-instruct" and res["complete"] is True


@pytest.mark.timeout(600)  # its time is measured by bench/eval.py (target 120 s), not here
def test_spade_eval_issue_command(tmp_path):
    """The issue's command, in the default suite (about 40 s here), replies capped at 128
    tokens: at the suites' own limits one rambling reply decodes for minutes. BFCL: its first
    two entries of ``bfcl_v4`` (single-turn, tools through the chat template): a multi-turn
    episode sends BFCL's own function docs (about 6,400 tokens) every step, minutes per step
    for this CPU engine (its scripted-engine tests are in test_eval_bfcl.py)."""
    res, _ = _spade_eval(tmp_path, "aime25,humaneval,rg_logic,bfcl_v4", limit=2, max_tokens=128)
    assert set(res["suites"]) == {"aime25", "humaneval", "rg_logic", "bfcl_v4"}
    assert all(s["samples"] == 2 for s in res["suites"].values())
