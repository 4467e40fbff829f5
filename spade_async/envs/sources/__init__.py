"""Environments from other ecosystems, by a scheme in the value (``fixed_pool``, ``spade memory import``).

    rg:NAME[,NAME...][?size=N&seed=S&per_env=K&attempts=A]   reasoning-gym datasets
    gym:[MODULE:]ID[?max_turns=T]                            a Gymnasium env with Text spaces
    gem:ID[?max_turns=T]                                     a GEM game (gem-llm)
    verifiers:MODULE[?size=N&per_env=K&max_turns=T]         a verifiers environment (installed)

Each scheme's module turns the value into ordinary environment sources of ours
(``Item``: one Python file each, the contract of docs/environments.md) that then go through the
same validation gates, run in the same sandbox and are stored in memory like a generated
environment, with the value recorded as its origin. A source file imports its library inside
the sandbox worker, so the pool must bind it (``envs.packages``; ``Source.packages`` names
the distributions). Every value written into a source is a Python literal (``repr`` of
plain data, checked by ``ast.literal_eval``), never code.

A value that cannot be imported (unknown scheme, missing package or dataset, a non-text
observation or action) raises ``SourceError``: one line naming it and the fix, before
anything is stored.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from urllib.parse import parse_qsl

import msgspec

from spade_async.errors import UsageError

__all__ = ["SCHEMES", "Item", "Source", "SourceError", "is_scheme", "literal", "load", "parse"]

# scheme -> (module under spade_async.envs.sources, distributions the workers import)
SCHEMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rg": ("rg", ("reasoning-gym",)),
    "gym": ("gym", ("gymnasium",)),
    "gem": ("gem", ("gem-llm",)),
    "verifiers": ("verifiers", ("verifiers",)),
}
_SCHEME = re.compile(r"^([a-z][a-z0-9_-]*):(?!//)(.*)$", re.DOTALL)


class SourceError(UsageError):
    """A source value that cannot be imported (one line: what, and what to install or choose)."""


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One environment made from a source: its Python source and where it came from."""

    code: str
    origin: str  # the value (and the part of it) this environment holds
    skill: str
    setting: str = "games"
    packages: tuple[str, ...] = ()  # distributions it imports beyond its scheme's own


class Source(msgspec.Struct, frozen=True, kw_only=True):
    value: str
    scheme: str
    target: str
    options: dict[str, str]
    packages: tuple[str, ...]


def is_scheme(value: str) -> bool:
    """Whether ``value`` names a source by scheme (``rg:...``) rather than a path. A Windows
    drive letter or a path with a colon in a later part is a path."""
    m = _SCHEME.match(value)
    return bool(m) and len(m.group(1)) > 1 and "/" not in m.group(1)


def parse(value: str) -> Source:
    m = _SCHEME.match(value.strip())
    if not m or m.group(1) not in SCHEMES:
        got = m.group(1) if m else value
        raise SourceError(
            f"unknown environment source scheme {got!r} in {value!r}; choose one of "
            + ", ".join(f"'{s}:'" for s in SCHEMES)
            + " or a directory of environment files"
        )
    scheme, rest = m.group(1), m.group(2)
    target, _, query = rest.partition("?")
    try:
        options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise SourceError(f"{value!r}: the options after '?' are not key=value&key=value") from None
    if not target.strip():
        raise SourceError(f"{value!r} names nothing after '{scheme}:'; e.g. {_EXAMPLE[scheme]}")
    return Source(
        value=value, scheme=scheme, target=target.strip(), options=options,
        packages=SCHEMES[scheme][1],
    )  # fmt: skip


_EXAMPLE = {
    "rg": "rg:basic_arithmetic,leg_counting?size=100",
    "gym": "gym:spade_textgym:spade/GuessNumber-v0",
    "gem": "gem:game:GuessTheNumber-v0",
    "verifiers": "verifiers:vf_reverse_text",
}


def require(value: str, *modules: str, install: str) -> None:
    """A missing library is one line naming it and what to install (nothing is imported)."""
    for mod in modules:
        if importlib.util.find_spec(mod) is None:
            raise SourceError(
                f"{value!r} needs the Python package {mod!r}, which is not installed here: "
                f"pip install {install}"
            )


def int_option(src: Source, key: str, default: int, lo: int, hi: int) -> int:
    raw = src.options.get(key)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise SourceError(f"{src.value!r}: option {key}={raw!r} must be an integer in [{lo}, {hi}]")
    return n


def check_options(src: Source, known: set[str]) -> None:
    odd = sorted(set(src.options) - known)
    if odd:
        raise SourceError(
            f"{src.value!r}: unknown option {odd[0]!r} for '{src.scheme}:'; known: "
            + ", ".join(sorted(known))
        )


def literal(value: object) -> str:
    """``value`` as Python source that evaluates to it, or ValueError: plain data only (str,
    numbers, bools, None, and lists/tuples/dicts/sets of them), so a value never becomes code."""
    text = repr(value)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"not plain data: {type(value).__name__}") from None
    if back != value and value == value:  # NaN is the one value unequal to itself
        raise ValueError(f"does not round-trip as a literal: {type(value).__name__}")
    return text


def class_name(text: str, suffix: str = "Env") -> str:
    """An identifier ``<Camel>Env`` from free text (letters and digits only)."""
    parts = re.findall(r"[A-Za-z0-9]+", text)
    name = "".join(p[:1].upper() + p[1:] for p in parts)[:60] or "Imported"
    if name[0].isdigit():
        name = "E" + name
    return name + suffix


def load(value: str) -> tuple[Source, list[Item], list[str]]:
    """The environments ``value`` names: (source, items, notes). Raises SourceError."""
    src = parse(value)
    mod = importlib.import_module(f"spade_async.envs.sources.{SCHEMES[src.scheme][0]}")
    items, notes = mod.items(src)
    if not items:
        raise SourceError(f"{value!r} gave no environments" + (f": {notes[0]}" if notes else ""))
    return src, items, notes
