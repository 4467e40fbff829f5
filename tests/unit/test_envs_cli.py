"""`spade env check`: exit codes 0/1/2, JSON fields, bad input never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spade_async.cli import main

VALID = r"""
import random, re

class PickEnv:
    def __init__(self, max_turns=6, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.code, self.turn = [self.rng.randint(0, 3) for _ in range(2)], 0
        return "Find the two digits (0-3), one per turn: \\boxed{d}.", {}
    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(\d)\}", action)
        pos = len(getattr(self, "found", []))
        if m and int(m.group(1)) == self.code[pos]:
            self.found = getattr(self, "found", []) + [int(m.group(1))]
            if len(self.found) == 2:
                return "Solved.", 1.0, True, False, {}
            return "Right, next digit.", 0.5, False, False, {}
        return "Wrong.", 0.0, False, self.turn >= self.max_turns, {}
    def solution(self):
        return [f"\\boxed{{{d}}}" for d in self.code]
""".replace("self.code, self.turn =", "self.found = []\n        self.code, self.turn =")

FIELDS = {
    "valid",
    "stage",
    "reason",
    "env_class",
    "multi_turn",
    "feasibility",
    "isolation",
    "seconds",
}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "ok.py").write_text(VALID)
    (tmp_path / "bad.py").write_text(VALID.replace("return [f", "return ['\\\\boxed{9}'] or [f"))
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "binary.py").write_bytes(b"\x7fELF\x00\x01\x02\xff")
    (tmp_path / "notes.txt").write_text("Dear diary, today I wrote no Python.\n")
    return tmp_path


def run_json(capsys, *args) -> tuple[int, dict]:
    rc = main(["env", "check", *args, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    return rc, json.loads(out[0])


def test_valid_file_exit_0_with_all_fields(files, capsys):
    rc, v = run_json(capsys, str(files / "ok.py"), "--seeds", "0,1,2,3")
    assert rc == 0 and FIELDS <= set(v)
    assert v["valid"] is True and v["stage"] == "ok" and v["env_class"] == "PickEnv"
    assert v["feasibility"] == "proven" and v["multi_turn"] is True
    assert isinstance(v["seconds"], float) and v["isolation"]


def test_rejected_file_exit_1(files, capsys):
    rc, v = run_json(capsys, str(files / "bad.py"))
    assert rc == 1 and v["stage"] == "feasibility" and v["feasibility"] == "failed"


@pytest.mark.parametrize(
    "name,reason", [("empty.py", "empty"), ("binary.py", "binary"), ("notes.txt", "line 1")]
)
def test_bad_input_is_a_verdict(files, capsys, name, reason):
    rc, v = run_json(capsys, str(files / name))
    assert rc == 1 and v["stage"] == "syntax" and reason in v["reason"]


def test_usage_errors_exit_2(files, capsys):
    assert main(["env", "check", str(files / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["env", "check", str(files / "ok.py"), "--seeds", "1,x"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["env", "check", str(files)]) == 2  # a directory
    with pytest.raises(SystemExit) as exc:
        main(["env", "check", str(files / "ok.py"), "--no-such-flag"])
    assert exc.value.code == 2


def test_human_output_lists_gates(files, capsys):
    assert main(["env", "check", str(files / "bad.py")]) == 1
    out = capsys.readouterr().out
    assert "pass  determinism" in out and "FAIL  feasibility" in out and "REJECTED" in out


def test_console_script_end_to_end(files):
    res = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "env", "check", str(files / "ok.py"), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["valid"] is True
    assert "Traceback" not in res.stderr
