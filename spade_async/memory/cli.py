"""``spade memory ls|show ID|stats|export DEST|import SRC --run RUN_DIR [--json]``,
``spade memory verify RUN_DIR [--repair]``.

Everything shown is model-written or read from the run directory: it is printed through
``spade_async.safe_text`` (no raw control characters, one line per field), and a damaged
store is one line and exit 2 (``memory.integrity``).

``export DEST --format gymnasium`` writes an installable package of the valid environments
(spade_async/memory/package.py); ``--format jsonl`` one line per environment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from spade_async.cli.corpus import Parser
from spade_async.errors import ConfigError
from spade_async.memory.records import EnvRecord, safe_id, skill_problem
from spade_async.memory.store import MemoryStore, open_checked
from spade_async.safe_text import json_line, term


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="spade memory", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.add_argument("--run", required=True, type=Path, help="run directory (holds memory.lmdb)")
        s.add_argument("--json", action="store_true", help="print JSON")
        return s

    s = cmd("ls", "list environments")
    s.add_argument("--status", choices=["valid", "invalid", "duplicate", "quarantined"])
    s.add_argument("--skill")
    s.add_argument("--limit", type=int, default=None)
    cmd("show", "one environment, with its code").add_argument("id", help="id or unique prefix")
    cmd("stats", "counts: total, valid, duplicates, by skill, regret bands")
    s = cmd("export", "write <id>.py files (byte-identical) and manifest.jsonl")
    s.add_argument("dest", type=Path)
    s.add_argument("--status", choices=["valid", "invalid", "duplicate", "quarantined"])
    s.add_argument(
        "--format",
        choices=["files", "gymnasium", "jsonl", "verifiers", "openenv"],
        default="files",
        help="files: <id>.py + manifest.jsonl; gymnasium: an installable package registering "
        "each valid environment (gymnasium.make('spade/<Name>-v0')); jsonl: one line each; "
        "verifiers: a package verifiers.load_environment loads; openenv: an OpenEnv server + "
        "client (docs/interop.md)",
    )
    s.add_argument("--name", help="gymnasium/verifiers/openenv: the package's import name")
    s = cmd("import", "validate files in the sandbox and store them (a fixed pool enters here)")
    s.add_argument(
        "src", type=Path,
        help="a .py file or a directory of them, or a source by scheme (docs/interop.md): "
        "rg:NAME[,NAME..], gym:[MODULE:]ID, gem:ID, verifiers:MODULE",
    )  # fmt: skip
    s.add_argument(
        "--skill", help="skill for every file (default: a SKILL constant, else 'unspecified')"
    )
    s.add_argument("--setting", choices=["games", "tool_use"])
    s.add_argument(
        "--seeds", default="",
        help="validation seeds, comma-separated (default: drawn at random per file, as in training)",
    )  # fmt: skip
    s = sub.add_parser(
        "verify", help="check memory.lmdb; --repair copies readable records to a fresh store"
    )
    s.add_argument("run", type=Path, help="run directory (holds memory.lmdb)")
    s.add_argument(
        "--repair", action="store_true", help="replace a damaged store by its readable records"
    )
    s.add_argument("--json", action="store_true", help="print JSON")
    return p


def _origin(rec: EnvRecord) -> str:
    o = rec.origin
    return f"{o.kind}@v{o.policy_version}" if o.policy_version is not None else o.kind


def row(rec: EnvRecord) -> dict:
    """The ``ls`` / manifest view of a record."""
    s = rec.stats
    return {
        "id": rec.id,
        "env_class": rec.env_class,
        "skill": rec.skill,
        "status": rec.status,
        "origin": _origin(rec),
        "setting": rec.setting,
        "stage": rec.stage,
        "doc_id": rec.doc_id,
        "duplicate_of": rec.duplicate_of,
        "win_rate_nohint": s.win_rate_nohint,
        "win_rate_hint": s.win_rate_hint,
        "regret": s.regret,
        "times_replayed": s.times_replayed,
        "quarantine": rec.quarantine,
        "quarantine_step": rec.quarantine_step,
    }


def full(rec: EnvRecord) -> dict:
    out = msgspec.to_builtins(rec)
    out.pop("source")
    out["code"] = rec.code
    out["status"] = rec.status
    out["stats"].update(
        win_rate_nohint=rec.stats.win_rate_nohint,
        win_rate_hint=rec.stats.win_rate_hint,
        regret=rec.stats.regret,
        designer_reward=rec.stats.designer_reward,
    )
    return out


def _print_json(obj) -> None:
    print(json_line(obj))


def _ls(store: MemoryStore, args) -> None:
    if args.limit is not None and args.limit < 0:  # -1 listed nothing, exit 0
        raise ConfigError(f"--limit = {args.limit} is out of range: must be >= 0")
    rows = [row(r) for r in store.records(status=args.status, skill=args.skill, limit=args.limit)]
    if args.json:
        _print_json(rows)
        return
    for r in rows:
        rate = "-" if r["win_rate_nohint"] is None else f"{r['win_rate_nohint']:.2f}"
        print(
            f"{term(r['id'][:12])}  {term(r['status']):<9} {term(r['skill'], limit=40):<22} "
            f"{term(r['env_class'], limit=40):<24} {term(r['origin']):<12} win={rate} "
            f"regret={r['regret']:.3f}"
            + (
                f"  quarantined at step {r['quarantine_step']}: {term(r['quarantine'], limit=120)}"
                if r["quarantine"]
                else ""
            )
        )


def _show(store: MemoryStore, args) -> None:
    rec = store.resolve(args.id)
    if args.json:
        _print_json(full(rec))
        return
    info = full(rec)
    code = info.pop("code")
    for key, value in info.items():
        print(f"{key:>14}: {term(value)}")
    print("\n" + term(code, multiline=True))


def _stats(store: MemoryStore, args) -> None:
    st = store.stats()
    if args.json:
        _print_json(st)
        return
    for key, value in st.items():
        print(f"{key:>14}: {term(value)}")


def _export(store: MemoryStore, args) -> None:
    dest: Path = args.dest
    if args.format != "files":
        from spade_async.memory import package

        records = list(store.records(status=args.status or "valid"))
        if args.format in ("gymnasium", "verifiers", "openenv"):
            if args.status not in (None, "valid"):
                raise ConfigError(f"--format {args.format} exports valid environments only")
            if args.format == "gymnasium":
                export = package.export_gymnasium
            elif args.format == "verifiers":  # docs/interop.md
                from spade_async.memory.export_verifiers import export_verifiers as export
            else:
                from spade_async.memory.export_openenv import export_openenv as export
            out = export(records, dest, run_dir=args.run, name=args.name)
            what = f"package {out['package']} ({out['environments']} environments) in {dest}"
        else:
            out = package.export_jsonl(records, dest, run_dir=args.run)
            what = f"{out['environments']} environments to {out['dest']}"
        if args.json:
            _print_json(out)
        else:
            print(f"exported {term(what)}\n{out.get('note', package.NOTE)}")
        return
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(dest / "manifest.jsonl", "wb") as manifest:
        for rec in store.records(status=args.status):
            if not safe_id(rec.id):  # a tampered id never names a file (verify refuses it)
                continue
            (dest / f"{rec.id}.py").write_bytes(rec.source)
            line = row(rec) | {
                "file": f"{rec.id}.py",
                "hints": rec.hints,
                "reason": rec.reason,
                "origin_source": rec.origin.source,
            }
            manifest.write(msgspec.json.encode(line) + b"\n")
            n += 1
    if args.json:
        _print_json({"exported": n, "dest": str(dest)})
    else:
        print(f"exported {n} environments to {term(dest)} (manifest.jsonl)")


def _import(args) -> None:
    import anyio

    from spade_async.memory.importer import import_files, is_source_value, preload

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        raise ConfigError(
            f"--seeds '{args.seeds}' is not a comma-separated list of integers"
        ) from None
    if args.skill is not None and (why := skill_problem(args.skill)) is not None:
        raise ConfigError(f"--skill: {why}; give a short one-line name such as 'logic'")
    src = args.src
    if is_source_value(src):  # made (and a bad value refused) before memory is opened
        src = preload(str(src))
        for note in src.notes:
            print(f"note: {term(note, limit=300)}", file=sys.stderr)
    args.run.mkdir(parents=True, exist_ok=True)
    with open_checked(args.run / "memory.lmdb", readonly=False) as store:
        outcomes = anyio.run(
            lambda: import_files(store, src, seeds=seeds, skill=args.skill, setting=args.setting)
        )
    counts = {"accepted": 0, "rejected": 0, "duplicate": 0, "skipped": 0}
    for o in outcomes:
        counts[o.outcome] += 1
        why = (
            o.reason
            if o.outcome in ("rejected", "skipped")
            else (f"duplicate of {o.duplicate_of[:12]}" if o.duplicate_of else "valid")
        )
        line = f"{o.outcome:<9} {term(o.path)}: {term(o.stage)}: {term(why, limit=400)}"
        print(line, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        _print_json(counts)
    else:
        print(
            f"accepted {counts['accepted']}, rejected {counts['rejected']}, "
            f"duplicate {counts['duplicate']}"
            + (
                f", skipped {counts['skipped']} (a skill that cannot be stored)"
                if counts["skipped"]
                else ""
            )
        )


def _verify(args) -> int:
    from spade_async.memory import integrity
    from spade_async.memory.repair import repair, verify
    from spade_async.memory.swap import finish

    path = args.run / "memory.lmdb"
    finish(path)  # a repair a kill interrupted: completed before the check
    if not (path / "data.mdb").is_file():
        raise ConfigError(f"no environment memory at '{path}'; pass a run directory that has one")
    report = verify(path)
    if report["damage"] is not None and args.repair:
        n, kept = repair(path)
        report |= {"repaired": n, "damaged_store": str(kept)}
        if args.json:
            _print_json(report)
        else:
            print(f"repaired {term(path)}: {n} readable record(s) copied into a fresh store "
                  f"(was: {term(report['damage'])}); the damaged store is kept as {term(kept)}")  # fmt: skip
        return 0
    if args.json:
        _print_json(report)
    elif report["damage"] is None:
        print(f"{term(path)}: whole, {report['records']} record(s) readable")
    if report["damage"] is not None:
        err = integrity.damaged(path, report["damage"])
        raise integrity.DamagedMemory(f"{err} ({report['recoverable']} record(s) recoverable)")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "import":
        _import(args)
        return 0
    if args.cmd == "verify":
        return _verify(args)
    if not (args.run / "memory.lmdb" / "data.mdb").is_file():
        MemoryStore(args.run / "memory.lmdb", readonly=True)  # its one-line "no memory" error
    with open_checked(args.run / "memory.lmdb") as store:
        {"ls": _ls, "show": _show, "stats": _stats, "export": _export}[args.cmd](store, args)
    return 0
