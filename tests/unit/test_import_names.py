"""No name in the repository root shadows an installed package.

Every ``python -m ...`` started from the root (pytest, the trainer ranks, the CPU engine, the
watchdog) has the root on ``sys.path`` first, so a root folder with an ``__init__.py`` or a
root ``.py`` file wins over a distribution of the same top-level name. transformers 5.25
imports Hugging Face's ``kernels`` package; our root ``kernels/__init__.py`` shadowed it and
every model import died (issue 32). Our kernels import as ``spade_kernels``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _importable_root_names(root: Path) -> dict[str, Path]:
    """Top-level import names the root itself provides: packages and modules."""
    names = {}
    for p in root.iterdir():
        if p.name.startswith("."):
            continue
        if p.is_dir() and (p / "__init__.py").exists():
            names[p.name] = p
        elif p.is_file() and p.suffix == ".py":
            names[p.stem] = p
    return names


def _installed_top_level_names() -> dict[str, list[str]]:
    """Top-level module names of every installed distribution -> the distributions."""
    return importlib.metadata.packages_distributions()


def test_no_root_package_or_module_is_an_installed_top_level_name():
    installed = _installed_top_level_names()
    clashes = {
        name: installed[name]
        for name in _importable_root_names(ROOT)
        if name in installed and name not in _ours(installed)
    }
    assert not clashes, (
        f"these repository-root names shadow installed distributions: {clashes}; move the code "
        "below a folder without __init__.py and import it under a name of its own"
    )


def test_the_check_sees_a_planted_clash(tmp_path):
    # the rule above must be able to fail: a root package named like an installed one
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    names = _importable_root_names(tmp_path)
    assert set(names) == {"transformers"}
    assert "transformers" in _installed_top_level_names()


_PROBE = r"""
import importlib.util, json, sys
where = {}
for name in json.loads(sys.argv[1]):
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:  # a broken package is not this test's business
        where[name] = f"error: {type(exc).__name__}"
        continue
    where[name] = spec and (spec.origin or list(spec.submodule_search_locations or []))
print(json.dumps(where))
"""


def _resolve(names: list[str], cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(names)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ours(installed: dict[str, list[str]]) -> set[str]:
    return {n for n, dists in installed.items() if "spade-async" in dists}


def test_every_installed_name_resolves_the_same_from_the_root(tmp_path):
    """From the root (as `python -m` children see it) each name finds what it finds elsewhere."""
    installed = _installed_top_level_names()
    names = sorted(n for n in installed if n.isidentifier() and n not in _ours(installed))
    from_root, from_elsewhere = _resolve(names, ROOT), _resolve(names, tmp_path)
    shadowed = {n: from_root[n] for n in names if from_root[n] != from_elsewhere[n]}
    assert not shadowed, f"the repository root shadows installed packages: {shadowed}"


def test_transformers_model_path_imports_in_a_child_started_from_the_root():
    """The way the trainer ranks and the engine start: `python -m` from the root."""
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's `kernels` is not installed (the lock installs it)")
    code = (
        "import kernels, os, sys\n"
        "assert 'site-packages' in kernels.__file__, kernels.__file__\n"
        "from kernels import CUDAProperties\n"
        "import transformers.integrations.hub_kernels\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "import torch\n"
        "cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,\n"
        "    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)\n"
        "m = LlamaForCausalLM(cfg)\n"
        "print(m(torch.tensor([[1, 2, 3]])).logits.shape)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # `-c`, like `-m`, puts the working directory first on sys.path: the root, as for the
    # trainer ranks, the engine and the watchdog
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch.Size([1, 3, 32])" in out.stdout
