"""``spade memory export --format verifiers|openenv`` without verifiers or openenv-core installed:
the files, every model-written value a literal, the runtime's sandbox-or-loud-opt-in rule.
(tests/interop/ loads and plays them through the libraries' own clients.)"""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from spade_async.memory.cli import main as memory_main

DEMO = Path(__file__).resolve().parents[1] / "fixtures" / "demo_run"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    run = root / "run"
    shutil.copytree(DEMO, run, ignore=shutil.ignore_patterns("lock.mdb"))
    for fmt in ("verifiers", "openenv"):
        assert memory_main(["export", str(root / fmt), "--format", fmt, "--run", str(run),
                            "--name", f"demo_{fmt}"]) == 0  # fmt: skip
    return root


def test_files_and_manifest(exported):
    vf = exported / "verifiers"
    assert (vf / "pyproject.toml").is_file() and (vf / "demo_verifiers" / "_runtime.py").is_file()
    oe = exported / "openenv"
    manifest = (oe / "openenv.yaml").read_text()
    assert "app: demo_openenv.server.app:app" in manifest and "runtime: fastapi" in manifest
    for part in ("models.py", "client.py", "server/environment.py", "server/app.py"):
        ast.parse((oe / "demo_openenv" / part).read_text())
    init = (vf / "demo_verifiers" / "__init__.py").read_text()
    tree = ast.parse(init)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "load_environment" for n in tree.body)
    metas = json.loads((vf / "demo_verifiers" / "metadata.json").read_text())
    assert metas and all(m["solution_rewards"] for m in metas)
    # one task per seed: the validation seeds of every environment, as a literal
    seeds = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                  and n.targets[0].id == "SEEDS"))  # fmt: skip
    assert seeds == {m["name"]: m["validation"]["seeds"] for m in metas}


def test_model_written_code_is_a_literal(exported):
    """Each env module holds the record's source as a string constant (never as code)."""
    from spade_async.memory.store import MemoryStore

    with MemoryStore(DEMO / "memory.lmdb", readonly=True) as store:
        codes = {r.id[:12]: r.code for r in store.records(status="valid")}
    mods = sorted((exported / "openenv" / "demo_openenv" / "envs").glob("env_*.py"))
    assert len(mods) == len(codes)
    for path in mods:
        tree = ast.parse(path.read_text())
        source = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                      and n.targets[0].id == "SOURCE")  # fmt: skip
        assert isinstance(source, ast.Constant) and source.value == codes[path.stem[4:]]
        assert not any(isinstance(n, ast.ClassDef) for n in tree.body)


def test_runtime_sandboxes_or_needs_the_loud_opt_in(exported, tmp_path, monkeypatch, capsys):
    # the package's own __init__ imports verifiers: its runtime and envs, in a bare package
    pkg = tmp_path / "site" / "demo_bare"
    shutil.copytree(exported / "verifiers" / "demo_verifiers", pkg,
                    ignore=shutil.ignore_patterns("__init__.py"))  # fmt: skip
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(pkg.parent))
    runtime = importlib.import_module("demo_bare._runtime")
    module = "demo_bare.envs"
    name = sorted((pkg / "envs").glob("env_*.py"))[0].stem
    env = runtime.open_env(f"{module}.{name}")  # spade-async installed: its sandbox
    assert type(env).__name__ == "_Sandboxed" and env.isolation
    sandboxed = env.reset(seed=1)
    env.close()
    monkeypatch.setattr(runtime, "sandbox_available", lambda: False)
    monkeypatch.delenv(runtime.OPT_IN, raising=False)
    with pytest.raises(RuntimeError, match="SPADE_ALLOW_UNSANDBOXED=1"):
        runtime.open_env(f"{module}.{name}")
    monkeypatch.setenv(runtime.OPT_IN, "1")
    with pytest.warns(RuntimeWarning, match="UNSANDBOXED"):
        env = runtime.open_env(f"{module}.{name}")
    assert "WARNING" in capsys.readouterr().err
    assert env.reset(seed=1) == sandboxed  # the same episode either way
    for key in [k for k in sys.modules if k.startswith("demo_bare")]:
        monkeypatch.delitem(sys.modules, key)
