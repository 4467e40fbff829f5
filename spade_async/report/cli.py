"""``spade report RUN_DIR [--out DIR] [--compare RUN_DIR2]``: one offline HTML page.

Writes ``DIR/index.html`` (default ``RUN_DIR/report/``): every figure inline (SVG), no
script and nothing fetched, so the file can be mailed or opened from a disk. Exit status:
0 when the page was written (a partial or older run included: the page lists what is
missing), 2 when RUN_DIR (or the compared run) is no run directory or its config.toml does
not load (as ``spade train`` would refuse it), and 2 with the page written without it when
its memory.lmdb is damaged (one line naming ``spade memory verify RUN --repair``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spade_async.memory.integrity import DamagedMemory
from spade_async.safe_text import term


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade report", description=__doc__)
    p.add_argument("run_dir", type=Path, help="a run directory (runs/<name>)")
    p.add_argument("--out", type=Path, help="output directory (default RUN_DIR/report)")
    p.add_argument("--compare", type=Path, metavar="RUN_DIR2", help="a second run, side by side")
    args = p.parse_args(argv)
    from spade_async.report.data import load_run

    run = load_run(args.run_dir)  # UsageError (exit 2) for a path that is no run directory
    other = load_run(args.compare) if args.compare is not None else None
    from spade_async.report.page import render
    from spade_async.rundir import write_atomic

    page = render(run, other)
    out = args.out or args.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "index.html", page.encode("utf-8", "backslashreplace"))
    damaged = [r.damaged for r in (run, other) if r is not None and r.damaged]
    if damaged:  # the page shows the rest; the command says what is damaged, in one line
        raise DamagedMemory(f"{damaged[0]}; {out / 'index.html'} was written without it")
    print(f"wrote {term(out / 'index.html')} ({len(page) // 1024} KiB)")
    for m in run.missing:
        print(f"  missing: {term(m)}", file=sys.stderr)
    return 0
