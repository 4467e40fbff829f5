"""Static checks on environment source: the structure gate and import screening.

Parsing only, nothing executes. Import screening is feedback for the designer, not
security: the sandbox enforces the real limits.
"""

from __future__ import annotations

import ast

__all__ = ["StructureError", "find_env_class", "screen_imports", "ALLOWED_IMPORTS"]

ALLOWED_IMPORTS = frozenset({
    "abc", "array", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal",
    "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math",
    "numbers", "operator", "random", "re", "statistics", "string", "textwrap", "typing",
    "__future__", "tool_use", "spade_async",
})  # fmt: skip
# provided by the tool-use base class that the sandbox injects
_BASE_METHODS = {"ToolUseBaseEnv": {"step", "get_tools", "reset", "solution"}}


class StructureError(ValueError):
    """The source has no single environment class."""


def _base_name(node: ast.expr) -> str | None:
    """``Base``, ``mod.Base``, and subscripted ``Base[T]`` / ``mod.Base[int, str]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def find_env_class(tree: ast.Module) -> str:
    """Name of the one concrete top-level ``...Env`` class defining/inheriting reset and step."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def members(name: str, seen: frozenset) -> tuple[set[str], bool]:
        node, names, unknown = classes[name], set(), False
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(item.name)
            elif isinstance(item, ast.Assign):
                names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        for base in node.bases:
            b = _base_name(base)
            if b in classes and b not in seen:
                sub, unk = members(b, seen | {name})
                names |= sub
                unknown |= unk
            elif b in _BASE_METHODS:
                names |= _BASE_METHODS[b]
            elif b not in ("object", "Generic", "Protocol"):
                unknown = True  # e.g. gymnasium.Env: decided at load time
        return names, unknown

    cands = []
    for name in classes:
        if name.endswith("Env"):
            names, unknown = members(name, frozenset())
            if {"reset", "step"} <= names or unknown:
                cands.append(name)
    bases = {_base_name(b) for n in cands for b in classes[n].bases}
    concrete = [n for n in cands if n not in bases]
    if not concrete:
        found = ", ".join(n for n in classes) or "no classes"
        raise StructureError(
            f"no top-level class named ...Env with reset() and step() (found: {found})"
        )
    if len(concrete) > 1:
        raise StructureError(
            f"several environment classes ({', '.join(concrete)}); keep exactly one ...Env class"
        )
    return concrete[0]


# the only part of the project inside the sandbox: the tool-use base class (worker.py maps
# this import path to the injected class)
SANDBOX_MODULES = frozenset(
    {"tool_use", "spade_async", "spade_async.envs", "spade_async.envs.tool_use"}
)


def screen_imports(tree: ast.Module) -> list[str]:
    """Warnings for imports outside the allowed standard-library set, and for project
    modules other than the tool-use base class (they do not exist inside the sandbox)."""
    mods, project = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
            if node.module in ("spade_async", "spade_async.envs"):
                names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        mods |= {n.split(".")[0] for n in names}
        project |= {n for n in names if n.split(".")[0] == "spade_async"} - SANDBOX_MODULES
    warnings = []
    bad = sorted(mods - ALLOWED_IMPORTS)
    if bad:
        warnings.append(
            f"imports outside the allowed set: {', '.join(bad)} (environments are "
            "standard-library only; the sandbox blocks processes, network and files)"
        )
    if project:
        warnings.append(
            f"imports {', '.join(sorted(project))}, which the sandbox does not have (it fails at "
            "load); only spade_async.envs.tool_use (ToolUseBaseEnv) is available there"
        )
    return warnings
