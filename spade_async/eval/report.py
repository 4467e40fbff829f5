"""Printing results (a rich table) and ``--compare`` with a paired bootstrap interval."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from spade_async.errors import SpadeError
from spade_async.eval.metrics import COMPOSITE, PAPER_COLUMNS, Column, bootstrap
from spade_async.eval.types import Results, Sample

__all__ = ["print_table", "compare", "load_samples", "load_results", "summary", "print_summary"]


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


def _label(suite: str) -> str:
    return next((label for label, name in PAPER_COLUMNS.items() if name == suite), suite)


def _column(path: Path, suite: str) -> Column:
    samples = load_samples(path.parent / f"{suite}.jsonl")
    sizes = None
    if suite.startswith("bfcl_v4"):
        from spade_async.eval.suites.bfcl_lib import category_sizes

        sizes = category_sizes()
    return Column(suite, samples, sizes)


def _composite(names: list[str]) -> list[str]:
    labels = [_label(n) for n in names]
    return COMPOSITE if all(c in labels for c in COMPOSITE) else []


def summary(res: Results, path: Path, *, iters: int = 10_000) -> dict:
    """Each suite's table value with a 95% bootstrap interval (clustered: problems, RG
    tasks; BFCL and ACEBench per category), and the paper's composite when all eight of its
    columns are there."""
    cols = {_label(n): (_column(path, n), None) for n in res.suites}
    try:
        return bootstrap(cols, _composite(list(res.suites)), iters=iters)
    except ValueError as exc:
        raise SpadeError(f"{path}: {exc}") from None


def print_summary(rows: dict, console: Console | None = None) -> None:
    t = Table(title="paper columns (95% bootstrap interval, clustered by problem / RG task)")
    for col in ("column", "metric", "value", "95% CI", "clusters"):
        t.add_column(col)
    for name, r in rows.items():
        t.add_row(name, r["metric"], f"{r['value']:.4f}",
                  f"[{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]", str(r.get("clusters", "")))  # fmt: skip
    if "composite" not in rows:
        t.caption = f"composite (mean of {', '.join(COMPOSITE)}): not all eight columns were run"
    (console or Console(file=sys.stderr if not sys.stdout.isatty() else sys.stdout)).print(t)


def compare(a: Path, b: Path, *, as_json: bool = False, iters: int = 10_000) -> int:
    """B - A per suite (each on its table metric) and for the paper's composite, paired
    bootstrap 95% intervals clustered as ``summary``."""
    ra, rb = load_results(a), load_results(b)
    names = [s for s in ra.suites if s in rb.suites]
    if not names:
        raise SpadeError(f"{a} and {b} share no suite")
    cols = {_label(n): (_column(a, n), _column(b, n)) for n in names}
    try:
        rows = bootstrap(cols, _composite(names), iters=iters)
    except ValueError as exc:
        raise SpadeError(f"{b} vs {a}: {exc}") from None
    t = Table(title=f"B - A: {rb.model} vs {ra.model} (paired bootstrap 95%)")
    for col in ("column", "metric", "A", "B", "B-A", "95% CI", "clusters"):
        t.add_column(col)
    for name, r in rows.items():
        if name == "composite":
            ca = sum(rows[c]["a"] for c in r["columns"]) / len(r["columns"])
            r |= {"a": ca, "b": ca + r["value"]}
        t.add_row(name, r["metric"], f"{r['a']:.4f}", f"{r['b']:.4f}", f"{r['value']:+.4f}",
                  f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]", str(r.get("clusters", "")))  # fmt: skip
    if "composite" not in rows:
        t.caption = f"composite (mean of {', '.join(COMPOSITE)}): not every one in both runs"
    unpaired = {n: r["unpaired"] for n, r in rows.items() if r.get("unpaired")}
    if unpaired:
        t.caption = (
            (t.caption or "")
            + "; problems in one run only (left out): "
            + ", ".join(f"{n} {k}" for n, k in unpaired.items())
        )
    Console(file=sys.stderr if as_json else sys.stdout).print(t)
    if as_json:
        print(json.dumps({"a": str(a), "b": str(b), "columns": rows}))
    return 0
