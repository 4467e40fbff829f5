"""Configuration: frozen msgspec structs, TOML recipes, ``--set a.b=c`` overrides.

Each component owns its config struct next to its code; this module only composes them
and turns bad input into one clear line (``ConfigError``). Every field carries a one-line
doc as ``Annotated[T, Meta(description=...)]`` -- that doc is what the README's
configuration reference is generated from (``field_docs``).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec

from spade_async.errors import ConfigError

__all__ = [
    "Doc",
    "field",
    "load_config",
    "apply_overrides",
    "convert",
    "field_docs",
    "to_toml_dict",
]


def Doc(tp: Any, doc: str) -> Any:  # noqa: N802 - reads like a type
    """``Doc(int, "what it is")`` == ``Annotated[int, Meta(description="what it is")]``."""
    return Annotated[tp, msgspec.Meta(description=doc)]


def field(default: Any = msgspec.NODEFAULT, **kw: Any) -> Any:
    return msgspec.field(default=default, **kw)


def _struct_fields(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in msgspec.structs.fields(cls)}


def _strip(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _struct_of(tp: Any) -> type | None:
    tp = _strip(tp)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    return None


def _check_keys(cls: type, data: dict, path: str) -> None:
    fields = _struct_fields(cls)
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{(path + '.' if path else '') + close[0]}'?" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{full}'{hint} (valid here: {valid})")
        sub = _struct_of(fields[key])
        if sub is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' is a section; write [{full}] with keys")
            _check_keys(sub, value, full)


def known_only(cls: type, data: dict, path: str = "") -> tuple[dict, list[str]]:
    """``data`` without the keys ``cls`` does not know, and those keys: an older or newer
    run's config, read for its values (``convert`` still refuses a wrong type)."""
    fields, kept, unknown = _struct_fields(cls), {}, []
    for key, value in data.items():
        full = f"{path}.{key}" if path else key
        sub = _struct_of(fields[key]) if key in fields else None
        if key not in fields:
            unknown.append(full)
        elif sub is not None and isinstance(value, dict):
            kept[key], more = known_only(sub, value, full)
            unknown += more
        else:
            kept[key] = value
    return kept, unknown


def convert(cls: type, data: dict, at: str = "") -> Any:
    """Validate ``data`` against ``cls``; unknown keys, wrong types and values out of their
    range (``config_bounds``: one table, NaN and infinity refused) become ConfigError.
    ``at``: where ``cls`` sits in the run's config (``"memory"`` for a ``MemoryConfig``
    read alone), so a section is range-checked as it is in the whole config."""
    from spade_async.config_bounds import check as check_ranges

    _check_keys(cls, data, "")
    check_ranges(data, at)  # as written (a struct's own __post_init__ would speak first)
    try:
        obj = msgspec.convert(data, cls, strict=True)  # "3" is no int: every command refuses it
        check_ranges(obj, at)
        return obj
    except msgspec.ValidationError as exc:
        msg = str(exc)
        where = msg.rsplit(" - at `$.", 1)
        path = where[1].rstrip("`") if len(where) == 2 else "?"
        value = _lookup(data, path)
        raise ConfigError(
            f"config key '{path}' = {value!r}: {where[0].replace('`', '')}".rstrip()
        ) from None


def _lookup(data: Any, path: str) -> Any:
    for part in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return "?"
    return data


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # bare strings need no quotes on the command line


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b=c`` overrides (values parsed as TOML, else taken as strings)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not KEY=VALUE; write --set trainer.lr=1e-6")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}': '{part}' is not a section")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


def read_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"config file '{p}' not found; pass a TOML recipe such as configs/cpu-demo.toml"
        )
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{p}' is not valid TOML: {exc}") from None


def load_config(
    cls: type, path: str | Path | None = None, overrides: list[str] | None = None
) -> Any:
    data = read_toml(path) if path is not None else {}
    return convert(cls, apply_overrides(data, list(overrides or [])))


def to_toml_dict(obj: Any) -> dict:
    """A struct as plain builtins, ready for a resolved ``config.toml``."""
    return msgspec.to_builtins(obj)


def field_docs(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key path, type name, default, doc) for every leaf field, depth first."""
    rows = []
    for f in msgspec.structs.fields(cls):
        tp = _struct_fields(cls)[f.name]
        doc = ""
        if get_origin(tp) is Annotated:
            for meta in get_args(tp)[1:]:
                if isinstance(meta, msgspec.Meta) and meta.description:
                    doc = meta.description
        path = f"{prefix}{f.name}"
        sub = _struct_of(tp)
        if sub is not None:
            rows.extend(field_docs(sub, path + "."))
            continue
        default = (
            f.default
            if f.default is not msgspec.NODEFAULT
            else (f.default_factory() if f.default_factory is not msgspec.NODEFAULT else None)
        )
        rows.append((path, _type_name(_strip(tp)), default, doc))
    return rows


def _type_name(tp: Any) -> str:
    from typing import Literal

    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is not None or not hasattr(tp, "__name__"):
        return str(tp).replace("typing.", "")
    return tp.__name__
