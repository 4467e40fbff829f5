"""spade memory export --format gymnasium|jsonl, on the recorded fixture run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from spade_async.cli import main as spade
from spade_async.memory.store import MemoryStore

FIXTURE = Path(__file__).parents[1] / "fixtures" / "demo_run"

PLAY = r"""
import json, sys, warnings
import gymnasium
import {pkg}

assert "spade_async" not in sys.modules
out = []
for meta in {pkg}.metadata():
    for seed, want in meta["solution_rewards"].items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = gymnasium.make(meta["gym_id"])
        assert any("unsandboxed" in str(w.message) for w in caught), caught
        env.reset(seed=int(seed))
        actions = env.unwrapped.solution()
        env.reset(seed=int(seed))
        reward, term, n = 0.0, False, 0
        for a in actions:
            _, reward, term, trunc, _ = env.step(a)
            n += 1
            if term or trunc:
                break
        env.close()
        out.append([meta["gym_id"], seed, reward, term, n, want])
print(json.dumps(out))
"""


def _stored(status="valid") -> list:
    with MemoryStore(FIXTURE / "memory.lmdb", readonly=True) as store:
        return list(store.records(status=status))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("export") / "pkg"
    assert spade(["memory", "export", str(dest), "--run", str(FIXTURE), "--format",
                  "gymnasium", "--name", "spade_envs_fixture"]) == 0  # fmt: skip
    return dest


def test_package_layout_and_metadata(exported):
    root = exported / "spade_envs_fixture"
    metas = json.loads((root / "metadata.json").read_text())
    records = {r.id: r for r in _stored()}
    records_file = (FIXTURE / "episodes" / "records.jsonl").read_text().splitlines()
    played = {json.loads(x)["env_id"] for x in records_file}
    assert {m["id"] for m in metas} == set(records) and len(metas) == len(records)
    for m in metas:
        rec = records[m["id"]]
        assert m["skill"] == rec.skill and m["win_rate"] == rec.stats.win_rate_nohint
        assert m["validation"]["seeds"] == [0, 1, 2] and m["validation"]["stage"] == "ok"
        assert set(m["solution_rewards"]) == {"0", "1", "2"}
        assert all(v["terminated"] and v["reward"] >= 1.0 for v in m["solution_rewards"].values())
        assert m["lineage"] == {"shown": list(rec.shown), "shown_exported": list(rec.shown)}
        # the fixture's replay check flagged nothing; environments it never played: unknown
        assert m["replays"] is (True if m["id"] in played else None)
        module = (root / "envs" / f"{m['module'].rsplit('.', 1)[1]}.py").read_text()
        assert "model-written code" in module and repr(rec.code) in module  # exact source
    assert (exported / "README.md").read_text().startswith("# spade_envs_fixture\n\n**WARNING")
    project = tomllib.loads((exported / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["gymnasium>=1.0"]


def test_in_this_process_the_sandbox_plays_it(exported, monkeypatch):
    """With spade-async importable, gymnasium.make runs the environment in its sandbox."""
    import gymnasium

    monkeypatch.syspath_prepend(str(exported))
    import spade_envs_fixture as pkg

    meta = next(m for m in pkg.metadata() if m["setting"] == "tool_use")
    env = gymnasium.make(meta["gym_id"])
    try:
        assert env.unwrapped.sandboxed and env.unwrapped.get_tools()
        env.reset(seed=1)
        actions = env.unwrapped.solution()
        env.reset(seed=1)
        for a in actions:
            _, reward, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        assert (reward, term) == (meta["solution_rewards"]["1"]["reward"], True)
    finally:
        env.close()


def test_jsonl_export(tmp_path):
    assert spade(["memory", "export", str(tmp_path), "--run", str(FIXTURE), "--format",
                  "jsonl"]) == 0  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "environments.jsonl").read_text().splitlines()]
    assert len(lines) == len(_stored()) and all("model-written" in x["note"] for x in lines)
    by_id = {r.id: r for r in _stored()}
    assert all(x["code"] == by_id[x["id"]].code and x["status"] == "valid" for x in lines)


def test_bad_input(tmp_path, capsys):
    assert spade(["memory", "export", str(tmp_path / "x"), "--run", str(tmp_path / "none"),
                  "--format", "gymnasium"]) == 2  # fmt: skip
    assert "no environment memory" in capsys.readouterr().err
    assert spade(["memory", "export", str(tmp_path / "x"), "--run", str(FIXTURE), "--format",
                  "gymnasium", "--status", "invalid"]) == 2  # fmt: skip


@pytest.mark.timeout(300)
def test_fresh_venv_plays_every_solution_to_its_recorded_reward(exported, tmp_path):
    """pip install the package into a fresh venv that sees gymnasium (the shared venv's
    site-packages through a .pth) but not spade-async; every environment's solution()
    reaches its recorded reward through gymnasium.make."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    Path(site, "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    "--no-deps", "--no-build-isolation", "--no-index", str(exported)],
                   check=True, env=env, cwd=tmp_path)  # fmt: skip
    res = subprocess.run([py, "-c", PLAY.replace("{pkg}", "spade_envs_fixture")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    plays = json.loads(res.stdout.splitlines()[-1])
    assert len(plays) == 3 * len(_stored())
    for gym_id, seed, reward, term, n, want in plays:
        assert (reward, term, n) == (want["reward"], want["terminated"], want["steps"]), (
            gym_id,
            seed,
        )
    # the "module:id" form imports the package itself
    one = plays[0][0]
    res = subprocess.run([py, "-W", "ignore", "-c", "import gymnasium; "
                          f"gymnasium.make('spade_envs_fixture:{one}').reset(seed=0)"],
                         env=env, cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
