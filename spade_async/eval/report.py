"""Printing results (a rich table) and ``--compare`` with a paired bootstrap interval."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from spade_async.errors import SpadeError
from spade_async.eval.metrics import paired_bootstrap, per_problem
from spade_async.eval.types import Results, Sample

__all__ = ["print_table", "compare", "load_samples", "load_results"]


def print_table(res: Results) -> None:
    t = Table(
        title=f"{res.model}"
        + (f" (policy v{res.policy_version})" if res.policy_version is not None else "")
    )
    for col in ("suite", "metric", "value", "problems", "samples"):
        t.add_column(col)
    for name, r in res.suites.items():
        for metric, value in r.metrics.items():
            t.add_row(name, metric, f"{value:.4f}", str(r.n_problems), str(r.samples))
    console = Console(file=sys.stderr if not sys.stdout.isatty() else sys.stdout)
    console.print(t)
    for name, r in res.suites.items():  # what a suite skipped or approximated, one line each
        for note in r.notes:
            console.print(f"{name}: {note}", markup=False, highlight=False, soft_wrap=True)


def load_results(path: Path) -> Results:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Results)
    except FileNotFoundError:
        raise SpadeError(
            f"{path}: no such results.json (write one with spade eval --out DIR)"
        ) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SpadeError(f"{path}: not a spade eval results.json ({exc})") from None


def load_samples(path: Path) -> list[Sample]:
    """A ``<suite>.jsonl``; a malformed line is named (file:line) in one error."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise SpadeError(f"{path}: no such responses file") from None
    out = []
    dec = msgspec.json.Decoder(Sample)
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(dec.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise SpadeError(
                    f"{path}:{n}: not a sample line ({exc}); each line needs id, sample, prompt, completion, answer, extracted, score"
                ) from None
    return out


def _per_problem(path: Path) -> dict[str, float]:
    return {i: sum(s.score for s in g) / len(g) for i, g in per_problem(load_samples(path)).items()}


def compare(a: Path, b: Path, *, as_json: bool = False) -> int:
    ra, rb = load_results(a), load_results(b)
    rows = []
    t = Table(title=f"B - A: {rb.model} vs {ra.model} (paired bootstrap 95%)")
    for col in ("suite", "metric", "A", "B", "B-A", "95% CI", "problems"):
        t.add_column(col)
    for name in [s for s in ra.suites if s in rb.suites]:
        sa, sb = ra.suites[name], rb.suites[name]
        diff, lo, hi, n = paired_bootstrap(
            _per_problem(a.parent / f"{name}.jsonl"), _per_problem(b.parent / f"{name}.jsonl")
        )
        metric = next(iter(sa.metrics))
        rows.append({"suite": name, "metric": metric, "a": sa.metrics[metric], "b": sb.metrics.get(metric),
                     "diff": diff, "ci95": [lo, hi], "problems": n})  # fmt: skip
        t.add_row(name, metric, f"{sa.metrics[metric]:.4f}", f"{sb.metrics.get(metric, float('nan')):.4f}",
                  f"{diff:+.4f}", f"[{lo:+.4f}, {hi:+.4f}]", str(n))  # fmt: skip
    if not rows:
        raise SpadeError(f"{a} and {b} share no suite")
    Console(file=sys.stderr if as_json else sys.stdout).print(t)
    if as_json:
        print(json.dumps({"a": str(a), "b": str(b), "suites": rows}))
    return 0
