"""The embedded default corpus: Python's own documentation, built offline on first use.

A SMALL STAND-IN FOR A PRETRAINING CORPUS, so the designer has grounding documents with no
download: every ``pydoc_data.topics`` entry (the language reference behind ``help()``) and,
for each pure-Python standard-library module, its module docstring plus the docstrings of
its public classes and functions. Sources are parsed with ``ast``, never imported (some
stdlib modules have import side effects). The result is written once as JSONL to the cache
directory and then read like any other JSONL corpus. Real runs should point
``corpus.path`` at a real pretraining corpus (the SPADE paper grounds on one).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec

from spade_async.models import cache_root

NAME = "embedded"
LABEL = "embedded Python-docs corpus (a small stand-in for a pretraining corpus)"
_VERSION = 2
_SKIP = {"antigravity", "this", "idlelib", "test", "tkinter", "turtledemo", "lib2to3"}


def _topics() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield f"pydoc-topic:{name}", topics[name].strip()


def _module_doc(name: str, origin: Path) -> str | None:
    try:
        tree = ast.parse(origin.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    parts = [f"Module {name}\n\n{ast.get_docstring(tree) or ''}".strip()]
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                parts.append(f"{kind} {name}.{node.name}\n{doc}")
    text = "\n\n".join(parts)
    return text if len(text.split()) >= 30 else None


def _modules() -> Iterator[tuple[str, str]]:
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _SKIP:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        found = [(name, Path(spec.origin))]
        for folder in spec.submodule_search_locations or []:  # a package: its modules too
            found += [
                (f"{name}.{p.stem}", p)
                for p in sorted(Path(folder).glob("*.py"))
                if not p.stem.startswith("_")
            ]
        for mod, origin in found:
            text = _module_doc(mod, origin)
            if text:
                yield f"stdlib:{mod}", text


def embedded_path() -> Path:
    """The embedded corpus as JSONL, built on first call (a second or two)."""
    v = sys.version_info
    path = cache_root() / "corpus" / f"python-docs-{v.major}.{v.minor}-v{_VERSION}.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".jsonl")
    with os.fdopen(fd, "wb") as out:
        for doc_id, text in [*_topics(), *_modules()]:
            out.write(msgspec.json.encode({"id": doc_id, "text": text}) + b"\n")
    os.replace(tmp, path)
    return path
