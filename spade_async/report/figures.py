"""The report's figures: matplotlib (Agg, no display) drawn to inline SVG text.

Side effects of the runtime: matplotlib is imported here only (the Agg backend is selected
before pyplot loads; nothing opens a window), and its font cache is built on first use.
Text stays text in the SVG (``svg.fonttype = none``) so pages are small and searchable;
``svg.hashsalt`` makes ids stable, so one run directory gives the same page twice.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.ticker

from spade_async.safe_text import term

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update({
    "svg.fonttype": "none",
    "svg.hashsalt": "spade-report",
    "font.size": 9,
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # ships with matplotlib: the same page everywhere
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 96,
})  # fmt: skip

Series = tuple[Sequence[float], Sequence[float]]
PHASE_COLORS = {"generation": "#1f77b4", "env execution": "#2ca02c", "training": "#d62728",
                "weight push": "#ff7f0e", "checkpoint, other": "#8c564b",
                "busy (unsplit)": "#9467bd", "idle": "#d9d9d9"}  # fmt: skip
COMPONENT_STYLE = {"engines": "-o", "sandbox pool": "-s", "trainer": "-^"}
SIZE = (6.0, 2.8)


def _t(text: object) -> str:
    """Run-supplied text as plain text: control and bidi characters shown as escapes
    (``safe_text.term``: the SVG holds none raw), ``$...$`` not read as mathtext."""
    return term(text, limit=120).replace("$", r"\$")


def _svg(fig) -> str:
    buf = io.StringIO()
    with warnings.catch_warnings():  # a run's label in a script DejaVu lacks: boxes, no noise
        warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from font")
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: no XML prolog or DOCTYPE


def lines(
    data: Mapping[str, Series], *, title: str, ylabel: str = "", xlabel: str = "step",
    logy: bool = False, style: Mapping[str, str] | None = None,
    colors: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    fig, ax = plt.subplots(figsize=SIZE)
    for label, (xs, ys) in data.items():
        kw = {"color": colors[label]} if colors and label in colors else {}
        ax.plot(xs, ys, (style or {}).get(label, "-o"), label=_t(label), markersize=3, **kw)
    if logy and all(y > 0 for _, ys in data.values() for y in ys):
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set(title=_t(title), xlabel=xlabel, ylabel=ylabel)
    if data:
        ax.legend(fontsize=8, frameon=False)
    return _svg(fig)


def stacked_shares(data: Mapping[str, Mapping[str, float]], *, title: str) -> str:
    """One horizontal bar per component, split into its phases' shares of wall time."""
    fig, ax = plt.subplots(figsize=(6.0, 0.6 + 0.55 * max(1, len(data))))
    colors = dict(PHASE_COLORS)
    palette = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"][6:])
    seen: set[str] = set()
    for row, shares in enumerate(data.values()):
        left = 0.0
        for phase, share in shares.items():
            color = colors.setdefault(phase, next(palette, "#999999"))
            ax.barh(row, share, left=left, color=color,
                    label=_t(phase) if phase not in seen else None)  # fmt: skip
            if share >= 0.08:
                ax.text(left + share / 2, row, f"{share:.0%}", ha="center", va="center",
                        fontsize=8)  # fmt: skip
            seen.add(phase)
            left += share
    ax.set_yticks(range(len(data)), [_t(k) for k in data])
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.invert_yaxis()
    ax.set_title(title)
    ax.legend(fontsize=8, frameon=False, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return _svg(fig)


def bars(counts: Mapping[str, float], *, title: str, ylabel: str = "") -> str:
    fig, ax = plt.subplots(figsize=(6.0, 0.5 + 0.3 * max(2, len(counts))))
    labels = list(counts)
    ax.barh(range(len(labels)), [counts[k] for k in labels], color="#4c72b0")
    ax.set_yticks(range(len(labels)), [_t(k) for k in labels])
    for i, k in enumerate(labels):
        ax.text(counts[k], i, f" {counts[k]:g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set(title=title, xlabel=ylabel)
    return _svg(fig)


def distributions(
    by_window: Mapping[str, Mapping[int, Sequence[float]]], *, title: str, ylabel: str,
    window: int,
) -> str:  # fmt: skip
    """Per skill, the spread of values in each window: points plus the window mean."""
    fig, ax = plt.subplots(figsize=SIZE)
    skills = list(by_window)
    width = 0.8 / max(1, len(skills))
    for j, skill in enumerate(skills):
        wins = sorted(by_window[skill])
        for w in wins:
            vals = list(by_window[skill][w])
            x = w + (j - (len(skills) - 1) / 2) * width
            ax.scatter([x] * len(vals), vals, s=10, alpha=0.6, color=f"C{j}",
                       label=_t(skill) if w == wins[0] else None)  # fmt: skip
            if vals:
                ax.hlines(sum(vals) / len(vals), x - width / 2, x + width / 2, color=f"C{j}")
    ax.set(title=title, ylabel=ylabel, xlabel=f"window ({window} step(s) each)")
    ticks = sorted({w for c in by_window.values() for w in c})
    ax.set_xticks(ticks if len(ticks) <= 20 else ticks[:: len(ticks) // 20 + 1])
    ax.set_xlim(min(ticks, default=0) - 0.6, max(ticks, default=0) + 0.6)
    if skills:
        ax.legend(fontsize=7, frameon=False)
    return _svg(fig)


def compare_intervals(rows: Sequence[dict], labels: tuple[str, str]) -> str:
    """Each metric's mean and 95% interval for run A and run B, side by side."""
    fig, axes = plt.subplots(1, max(1, len(rows)), figsize=(2.0 * max(1, len(rows)), 2.4))
    axes = list(axes) if len(rows) > 1 else [axes]
    for ax, row in zip(axes, rows, strict=False):
        for i, key in enumerate(("a", "b")):
            mean, lo, hi = row[key]
            if not math.isnan(mean):
                ax.errorbar([i], [mean], yerr=[[mean - lo], [hi - mean]], fmt="o",
                            color=f"C{i}", capsize=4)  # fmt: skip
        ax.set_xticks([0, 1], [_t(x) for x in labels])
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(_t(row["metric"]), fontsize=8)
    return _svg(fig)
