"""``spade episode ls RUN_DIR`` and ``spade episode replay RUN_DIR (EPISODE_ID | --all)``.

``replay`` re-runs episodes in the sandbox and checks every observation and reward against
the record. Exit status: 0 when every episode checked replays exactly, 1 when one does not
(the memory environments concerned are flagged, and with ``--all`` the summary is written
to ``RUN_DIR/episodes/replay.json`` for ``spade report``), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from spade_async.errors import UsageError
from spade_async.safe_text import json_line, term


def _run_dir(path: Path) -> Path:
    if not path.is_dir():
        raise UsageError(f"run directory '{path}' does not exist; pass a run directory")
    return path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade episode", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("ls", help="list recorded episodes")
    ls.add_argument("run_dir", type=Path)
    ls.add_argument("--json", action="store_true")
    rp = sub.add_parser("replay", help="re-run episodes in the sandbox and compare")
    rp.add_argument("run_dir", type=Path)
    rp.add_argument("episode_id", nargs="?", help="an episode id (or unique prefix)")
    rp.add_argument("--all", action="store_true", help="every episode of the run")
    rp.add_argument("--concurrency", type=int, default=4, help="episodes replayed at once")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    from spade_async.episodes import records as R

    run_dir = _run_dir(args.run_dir)
    recs, bad = R.read_records(run_dir)
    if args.cmd == "ls":
        if args.json:
            rows = [msgspec.structs.asdict(r) | {"actions": len(r.actions)} for r in recs]
            print(json_line(rows))
        for r in recs if not args.json else []:
            print(
                f"{term(r.id):<16} step {r.step:<4} env {term(r.env_id[:12])} seed {r.seed:<11} "
                f"{'hint ' if r.hinted else '     '}{term(r.status, limit=40):<11} "
                f"reward {r.reward:+.3f} turns {len(r.actions)}"
            )
        if bad:
            print(f"({bad} unreadable line(s) skipped)", file=sys.stderr)
        return 0
    if args.all == bool(args.episode_id):
        raise UsageError("give one EPISODE_ID or --all (list ids with 'spade episode ls RUN_DIR')")
    if args.all and not recs:
        raise UsageError(
            f"no episode records in {R.records_path(run_dir)}; a run made by this version "
            "records every episode it plays"
        )
    chosen = recs if args.all else [R.find(run_dir, args.episode_id)]
    import anyio

    from spade_async.episodes.replay import replay_records, summarize, write_summary

    outcomes = anyio.run(lambda: replay_records(run_dir, chosen, concurrency=args.concurrency))
    summary = summarize(outcomes)
    if args.all:
        write_summary(run_dir, summary)
    if args.json:
        print(json_line(summary))
    else:
        for o in outcomes:
            if not o.exact or not args.all:
                where = "" if o.call is None else f" at call {o.call}"
                detail = ": " + term(o.detail, limit=300) if o.detail else ""
                print(f"{term(o.id)}: {o.verdict}{where}{detail}")
        print(
            f"replayed {summary.checked} episode(s): {summary.exact} exact "
            f"({summary.share:.0%})" + (f"; {bad} unreadable line(s) skipped" if bad else "")
        )
        for env_id, n in sorted(summary.flagged_envs.items()):
            print(
                f"flagged: memory environment {term(env_id[:12])} no longer replays ({n} episode(s))"
            )
    return 0 if summary.exact == summary.checked else 1
