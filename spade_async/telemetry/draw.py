"""What every terminal view draws with: the dashboard's names (stages, roles, gates, curves,
the metric keys it knows) and its text glyphs (sparklines, histograms, bars). A leaf:
``dashboard`` and ``panels`` both import it, neither imports the other's internals."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text

__all__ = [
    "STAGES", "ROLES", "GATES", "CURVES", "KNOWN", "sparkline", "histogram", "bars_from_counts",
    "bar", "fmt", "hms", "finite",
]  # fmt: skip

STAGES = ("engine", "trainer", "env_pool")
ROLES = ("designer", "hint", "agent", "trainer")
GATES = (
    "ok", "syntax", "structure", "load", "reset", "step", "determinism", "not_done_at_reset",
    "feasibility", "timeout", "memory", "crash", "output_too_large",
)  # fmt: skip
CURVES = (
    ("reward/agent_mean", "agent reward"),
    ("reward/designer_mean", "designer reward"),
    ("regret/mean", "regret (mean)"),
)
KNOWN = re.compile(
    r"^(version|max_steps|time/|tokens_per_s/|busy_s/|idle_s/|stream/|designer/|regret/|"
    r"win_rate/|reward/|memory/|engine/|trainer/healthy|trainer/restarts|router/healthy|staleness/|hint/|"
    r"train/push|train/lost_batches|train/mismatch_|train/logprob_gap|train/is_weight_)"
)
_SPARK = "▁▂▃▄▅▆▇█"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def sparkline(values: list[float], width: int = 24) -> str:
    vals = [float(v) for v in values[-width:] if v is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return "".join(_SPARK[int((v - lo) / span * 7.999) if span > 0 else 3] for v in vals)


def histogram(values: list[float], bins: int = 20, lo: float = 0.0, hi: float = 1.0) -> str:
    """One character per bin, height proportional to the count; an empty bin is a space."""
    counts = [0] * bins
    for v in values:
        i = int((min(max(v, lo), hi) - lo) / (hi - lo) * bins)
        counts[min(i, bins - 1)] += 1
    return bars_from_counts(counts)


def bars_from_counts(counts: list[int]) -> str:
    top = max(counts, default=0) or 1
    return "".join(" " if c == 0 else _SPARK[min(int(c / top * 7.999), 7)] for c in counts)


def bar(frac: float, width: int = 20, style: str = "green") -> Text:
    frac = min(max(frac, 0.0), 1.0)
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    body = "█" * full + (_EIGHTHS[part] if part else "")
    return Text(body, style=style) + Text("·" * (width - len(body)), style="grey35")


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def hms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--:--"
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def finite(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    out = []
    for v in values:
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v == v
            and abs(v) != float("inf")
        ):
            out.append(float(v))
    return out
