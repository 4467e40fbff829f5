"""Imports run one way: the import-linter contracts in pyproject.toml (the layering rule of
docs/architecture.md) hold for the package, and break when a lower layer imports a higher one
or two independent rooms meet."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# -S: no .pth files, so the editable install's import hook does not shadow the copy under test
LINT = (
    "import sys; sys.path[:0] = [{tree!r}, *{site!r}]; "
    "from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename={config!r}, no_cache=True, no_logo=True))"
)


def lint(tree: Path) -> subprocess.CompletedProcess:
    code = LINT.format(
        tree=str(tree), site=site.getsitepackages(), config=str(tree / "pyproject.toml")
    )
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tree, capture_output=True, text=True, timeout=300
    )


def copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "spade_async", tree / "spade_async", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_package_keeps_every_contract(tmp_path):
    out = lint(copy_tree(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and "KEPT" in out.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(tmp_path):
    tree = copy_tree(tmp_path)
    errors = tree / "spade_async" / "errors.py"  # the lowest layer imports the main loop
    errors.write_text(errors.read_text() + "\n\ndef _late():\n    import spade_async.loop.run\n")
    out = lint(tree)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "spade_async.errors is not allowed to import spade_async.loop" in out.stdout


def test_two_independent_rooms_meeting_breaks_independence(tmp_path):
    tree = copy_tree(tmp_path)
    pool = tree / "spade_async" / "envs" / "replies.py"  # the sandbox side reaches the trainer
    pool.write_text(pool.read_text() + "\n\ndef _late():\n    import spade_async.trainer.batch\n")
    out = lint(tree)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "do not know each other BROKEN" in out.stdout
