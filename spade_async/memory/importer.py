"""``spade memory import``: every file goes through the validation gates, then into memory.

This is how a fixed environment pool enters the system. Files are validated concurrently in
the sandboxed pool (``spade_async.envs.validate.validate_source``); each becomes a record
(valid or not, with its stage and reason), written by one ``MemoryWriter``. Files that are
not UTF-8 text, or too large, are rejected before they reach a sandbox; a file whose skill
cannot be stored (not a one-line string of 1-200 UTF-8 bytes: ``records.skill_problem``)
is skipped and counted, and the import goes on.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from spade_async.envs.sources import Item, SourceError, is_scheme
from spade_async.envs.sources import load as load_source
from spade_async.errors import ConfigError
from spade_async.memory.records import Origin, env_id, make_record, skill_problem
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter

MAX_BYTES = 1 << 20
PACKAGE_OPEN_S = 60.0  # open budget of a pool whose workers import a library


class FileOutcome(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    outcome: Literal["accepted", "rejected", "duplicate", "skipped"]
    id: str | None
    stage: str
    reason: str
    duplicate_of: str | None = None


class Loaded(msgspec.Struct, frozen=True, kw_only=True):
    """A source value made into environment sources, not yet validated or stored."""

    value: str
    items: list[Item]
    notes: list[str]
    packages: tuple[str, ...]


def preload(value: str) -> Loaded:
    """The environments a source value names (``SourceError`` for a bad one: nothing stored)."""
    src, found, notes = load_source(value)
    extra = tuple(p for it in found for p in it.packages if p not in src.packages)
    return Loaded(value=value, items=found, notes=notes, packages=src.packages + extra)


def is_source_value(src: Path | str) -> bool:
    """A scheme value (``rg:...``) rather than a file or directory that exists."""
    if not is_scheme(str(src)):
        return False
    try:
        return not Path(src).exists()
    except OSError:  # a name too long for a path: a value
        return True


def collect(src: Path) -> list[Path]:
    if not src.exists():
        raise ConfigError(f"import source '{src}' does not exist; pass a .py file or a directory")
    files = (
        [src]
        if src.is_file()
        else sorted(p for p in src.rglob("*.py") if p.is_file() and p.name != "__init__.py")
    )
    if not files:
        raise ConfigError(f"import source '{src}' holds no .py files")
    return files


@functools.cache
def _bundled() -> dict[str, tuple[str, str]]:
    """Bundled examples by content id -> (skill, setting), so copies keep their skill."""
    try:
        from spade_async.envs.examples import EXAMPLES, HERE
    except ImportError:
        return {}
    return {env_id((HERE / name).read_text()): tag for name, tag in EXAMPLES.items()}


def _skill_of(code: str, default: str | None) -> str:
    if default:
        return default
    try:
        for node in ast.parse(code).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("SKILL", "skill")
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    m = re.search(r"^#\s*skill:\s*([\w-]+)", code, re.MULTILINE)
    if m:
        return m.group(1)
    return _bundled().get(env_id(code), ("unspecified", ""))[0]


def _setting_of(code: str, default: str | None) -> str:
    if default:
        return default
    if env_id(code) in _bundled():
        return _bundled()[env_id(code)][1]
    return "tool_use" if re.search(r"class\s+\w*Env\s*\([^)]*ToolUse", code) else "games"


async def _validate(path: Path, data: bytes, pool, seeds) -> tuple[str | None, object | None]:
    """(rejection reason, verdict): a reason when the file never reaches the gates."""
    if len(data) > MAX_BYTES:
        return f"file is over the {MAX_BYTES}-byte limit", None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})", None
    from spade_async.envs.validate import validate_source

    return None, await validate_source(source, pool=pool, seeds=seeds)


async def import_files(
    store: MemoryStore,
    src: Path | str | Loaded,
    *,
    seeds: tuple[int, ...] = (),  # empty: the validator draws them per file
    skill: str | None = None,
    setting: str | None = None,
    kind: Literal["import", "pool"] = "import",
    pool=None,
    writer: MemoryWriter | None = None,
) -> list[FileOutcome]:
    """Validate and store every ``.py`` under ``src``, or every environment a source value
    names (``rg:...``: spade_async.envs.sources; a bad value raises ``SourceError`` before
    anything is stored). Pass the run's ``pool`` (an ``EnvPool``) and running ``writer`` to
    share them; otherwise both are made here (the pool binding the source's packages)."""
    from spade_async.envs.pool import EnvPool

    items: dict[int, object] = {}
    if isinstance(src, str) and is_scheme(src):  # rg:, gym:, gem:, verifiers: (envs.sources)
        src = await anyio.to_thread.run_sync(preload, src)
    if isinstance(src, Loaded):
        files: list[Path] = [Path(it.origin) for it in src.items]
        items = dict(enumerate(src.items))
        packages = src.packages
        src = src.value
    else:
        files, packages = collect(Path(src)), ()
    outcomes: list[FileOutcome | None] = [None] * len(files)
    own_writer = writer is None
    async with contextlib.AsyncExitStack() as stack:
        if pool is None:
            from spade_async.envs.pool import PoolConfig

            # a library's import (reasoning-gym, gem) takes seconds in a fresh worker
            budget = {"open_timeout_s": PACKAGE_OPEN_S, "call_timeout_s": 10.0} if packages else {}
            pool = await stack.enter_async_context(EnvPool(PoolConfig(packages=packages, **budget)))
        elif missing := sorted(set(packages) - set(pool.config.packages)):
            raise SourceError(
                f"{src!r} runs code that imports {missing[0]!r} in the sandbox: add it to "
                f"envs.packages (envs.packages = {sorted(set(pool.config.packages) | set(packages))})"
            )
        tg = await stack.enter_async_context(anyio.create_task_group())
        if writer is None:
            writer = MemoryWriter(store)
            await tg.start(writer.run)
        limit = anyio.CapacityLimiter(max(1, pool.config.max_workers))

        async def one(i: int, path: Path) -> None:
            item = items.get(i)
            if item is None:
                with open(path, "rb") as f:  # never more than the cap (+1 to see it is over)
                    data = f.read(MAX_BYTES + 1)
            else:
                data = item.code.encode("utf-8")
            code = data.decode("utf-8", errors="replace")
            file_skill = _skill_of(code, skill or (item.skill if item else None))
            odd = skill_problem(file_skill)
            if odd is not None:  # an odd record is skipped and counted, not fatal
                outcomes[i] = FileOutcome(path=str(path), outcome="skipped", id=None,
                                          stage="read", reason=odd)  # fmt: skip
                return
            async with limit:
                reason, verdict = await _validate(path, data, pool, list(seeds))
            fields = dict(
                skill=file_skill,
                setting=_setting_of(code, setting or (item.setting if item else None)),
                origin=Origin(kind=kind, source=item.origin if item else str(path)),
            )
            if verdict is None:
                rec = make_record(data, valid=False, stage="read", reason=reason, **fields)
            else:
                rec = make_record(
                    data,
                    valid=bool(verdict.valid),
                    stage=verdict.stage,
                    reason=verdict.reason,
                    env_class=verdict.env_class,
                    multi_turn=verdict.multi_turn,
                    feasibility=verdict.feasibility,
                    **fields,
                )
            put = await writer.put(rec)
            if not rec.valid:
                outcome = "rejected"
            elif put.outcome == "new":
                outcome = "accepted"
            else:
                outcome = "duplicate"
            outcomes[i] = FileOutcome(
                path=str(path),
                outcome=outcome,
                id=rec.id,
                stage=rec.stage,
                reason=rec.reason or "",
                duplicate_of=put.duplicate_of,
            )

        async with anyio.create_task_group() as files_tg:
            for i, path in enumerate(files):
                files_tg.start_soon(one, i, path)
        if own_writer:
            writer.close()
    return [o for o in outcomes if o is not None]
