"""What the verifiers and OpenEnv exports share: the environment modules, their metadata and
the runtime that runs them sandboxed (``interop_runtime.py``, copied as ``_runtime.py``).

``write_envs`` writes, under ``DEST/<pkg>/``::

    envs/env_<id>.py   one module per valid environment: its exact source as a literal
                       (SOURCE), sha256 and METADATA (package.py's ``_env_module``)
    _runtime.py        open_env(module): spade-async's sandbox, or a loud opt-in
    _tool_use.py       the tool-use base class a tool-use source names
    metadata.json      every environment's METADATA, with the reward its solution() reached
                       on each validation seed in spade-async's sandbox (``solution_rewards``)

Every model-written value enters a written source as a literal (repr, or JSON inside a repr).
An environment imported from a hub records the distributions it imports in the sandbox
(``METADATA["packages"]``, from its origin's scheme) so the runtime binds them there too.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import anyio
import msgspec
import tomli_w

from spade_async.memory import package
from spade_async.memory.records import EnvRecord, safe_id

NOTE = (
    "WARNING: every environment in this package is model-written code (a SPADE designer "
    "model wrote it during training). It passed spade-async's validation gates, which are "
    "checks, not a security review. With spade-async installed the environments run in its "
    "sandbox; without it they refuse to run unless you set SPADE_ALLOW_UNSANDBOXED=1, which "
    "runs them in your process, with a warning."
)


def packages_of(rec: EnvRecord) -> list[str]:
    """Distributions an imported environment's code imports in the sandbox (none if generated)."""
    from spade_async.envs.sources import is_scheme, parse

    src = rec.origin.source or ""
    if not is_scheme(src):
        return []
    try:
        parsed = parse(src.partition("#")[0])
    except Exception:
        return []
    out = list(parsed.packages)
    if parsed.scheme == "gym" and ":" in parsed.target:  # gym:MODULE:ID: the module's own
        top = parsed.target.rpartition(":")[0].split(".")[0]
        out += importlib.metadata.packages_distributions().get(top, [])[:1]
    return out


def write_envs(records: list[EnvRecord], dest: Path, *, run_dir: Path, name: str | None,
               default_seeds: tuple[int, ...] = (0, 1, 2)) -> tuple[str, list[dict]]:  # fmt: skip
    """Write the shared part of an export; returns (package name, metadata of each env)."""
    pkg = package.package_name(run_dir, name)
    valid = [r for r in records if r.status == "valid" and safe_id(r.id)]
    seeds = {r.id: package.validation_seeds(r, default_seeds) for r in valid}
    rewards = anyio.run(package.solution_rewards, valid, seeds)
    flagged = package._flagged(run_dir)
    exported = {r.id for r in valid}
    root = dest / pkg
    (root / "envs").mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    (root / "_runtime.py").write_bytes((here / "interop_runtime.py").read_bytes())
    (root / "_tool_use.py").write_bytes((here.parent / "envs" / "tool_use.py").read_bytes())
    (root / "envs" / "__init__.py").write_text('"""One module per exported environment."""\n')
    metas = []
    for rec in valid:
        meta = package.metadata(rec, seeds[rec.id], exported, flagged)
        meta["solution_rewards"] = rewards.get(rec.id, {})
        meta["module"] = f"{pkg}.envs.{package._module(rec)}"
        meta["packages"] = packages_of(rec)
        meta["origin_source"] = rec.origin.source
        (root / "envs" / f"{package._module(rec)}.py").write_text(
            package._env_module(rec, meta, pkg), encoding="utf-8"
        )
        metas.append(meta)
    (root / "metadata.json").write_bytes(msgspec.json.format(msgspec.json.encode(metas)))
    return pkg, metas


def environments_literal(metas: list[dict]) -> str:
    """``{name: module}`` as a Python literal (names and modules are ASCII identifiers here)."""
    return repr({m["name"]: m["module"] for m in metas})


def write_pyproject(
    dest: Path, pkg: str, run_dir: Path, *, what: str, deps: list[str], packages: list[str]
) -> None:
    """The exported package's pyproject.toml: ``what`` says what it is ("an OpenEnv server")."""
    (dest / "pyproject.toml").write_text(tomli_w.dumps({
        "build-system": {"requires": ["setuptools>=61"], "build-backend": "setuptools.build_meta"},
        "project": {
            "name": pkg.replace("_", "-"), "version": "0.1.0", "readme": "README.md",
            "description": f"Model-written environments from the SPADE run {run_dir.name}, as "
                           f"{what} (run them sandboxed)",
            "requires-python": ">=3.10", "dependencies": deps,
        },
        "tool": {"setuptools": {"packages": packages, "package-data": {pkg: ["metadata.json"]}}},
    }))  # fmt: skip
