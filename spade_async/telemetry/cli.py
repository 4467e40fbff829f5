"""``spade dashboard RUN_DIR``: watch a run's metrics.jsonl from another terminal or later.

Follows the file (new lines as they are written, until Ctrl-C) by default; ``--once``
renders the current state and exits. Not a terminal: one plain line per step instead.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spade_async.errors import UsageError
from spade_async.safe_text import term
from spade_async.telemetry.dashboard import Dashboard, PlainLogger
from spade_async.telemetry.metrics import METRICS_FILE, MetricsTail


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spade dashboard", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<name>)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--follow", action="store_true", help="keep reading new metrics (default)")
    mode.add_argument("--once", action="store_true", help="render the current state and exit")
    p.add_argument("--refresh", type=float, default=4.0, metavar="HZ", help="redraws per second")
    p.add_argument("--width", type=int, default=None, help="console width (default: terminal)")
    return p


def metrics_path(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    if not run.is_dir():
        raise UsageError(
            f"run directory '{run}' not found; pass runs/<name> of a run started with 'spade train'"
        )
    path = run / METRICS_FILE
    if not path.is_file():
        raise UsageError(
            f"'{path}' not found; the run has not logged a step yet (or '{run}' is not a run directory)"
        )
    return path


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.refresh > 0:
        raise UsageError(f"--refresh {args.refresh}: must be > 0, e.g. 4")
    path = metrics_path(args.run_dir)
    from rich.console import Console

    console = Console(width=args.width)
    title = f"SPADE  {term(path.parent.resolve().name)}"
    tail = MetricsTail(path)
    if args.once:
        view = Dashboard(console, args.refresh, title=title)
        for rec in tail.read_new() + tail.read_last_line():
            view.update(rec)
        console.print(view.render())
        return 0
    view = (
        Dashboard(console, args.refresh, title=title)
        if console.is_terminal
        else PlainLogger(console.file)
    )
    view.start()
    try:
        while True:
            records = tail.read_new()
            if tail.restarted:
                view.reset()
            for rec in records:
                view.update(rec)
            time.sleep(1.0 / args.refresh)
    except KeyboardInterrupt:
        pass
    finally:
        view.stop()
    return 0
