"""The terminal dashboard: a rich view built from metric records (schema: metrics.py).

``Dashboard.update(record)`` takes the same dicts that go to ``metrics.jsonl``, so the live
view in ``spade train`` and ``spade dashboard RUN_DIR`` share every line of this file.
``render()`` returns a rich renderable; ``start()``/``stop()`` run it under ``rich.live``.
``PlainLogger`` has the same interface and prints one line per step (stdout not a terminal).
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from typing import Any, TextIO

from rich.console import Console, RenderableType

from spade_async.safe_text import term
from spade_async.telemetry.config import TelemetryConfig
from spade_async.telemetry.draw import (
    bar,
    finite,
    fmt,
    histogram,
    hms,
    sparkline,
)

__all__ = ["Dashboard", "PlainLogger", "NullView", "make_view", "sparkline", "histogram", "bar"]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def clean(rec: Any) -> dict[str, Any] | None:
    """A record as the views may use it (None: nothing to show). ``metrics.jsonl`` is run-
    directory content: keys and strings go through ``safe_text.term`` (no raw control
    characters; rich markup is never parsed from them: panels wrap them in ``Text``); a step
    record keeps numbers, booleans, None and lists of finite numbers only, so a string
    or an infinity where a number belongs (``time/elapsed_s = "soon"``) is absent."""
    if not isinstance(rec, dict):
        return None
    kind = rec.get("kind", "step")
    if not isinstance(kind, str) or not _number(rec.get("step", 0)):
        return None
    out: dict[str, Any] = {}
    for key, v in rec.items():
        key = term(key, limit=120)
        if isinstance(v, bool) or v is None or _number(v):
            out[key] = v
        elif isinstance(v, list):
            out[key] = finite(v) if kind == "step" else [term(x, limit=80) for x in v[:32]]
        elif isinstance(v, str) and kind != "step":
            out[key] = term(v, limit=300)
    out["kind"] = kind
    return out


class _State:
    """Everything the views show, folded from records. Handles a resumed run re-logging
    steps it had already logged (history past the resume point is dropped)."""

    def __init__(self, window: int = 120, values_window: int = 512):
        self.latest: dict[str, Any] = {}
        self.prev: dict[str, Any] | None = None
        self.step = -1
        self.records = 0
        self.history: dict[str, deque] = {}
        self.window = window
        self.regret: deque = deque(maxlen=values_window)
        self.win_rate: deque = deque(maxlen=values_window)
        self.envs: deque = deque(maxlen=8)
        self.events: deque = deque(maxlen=4)
        self.pace: deque = deque(maxlen=20)  # (step, elapsed_s) for the ETA
        self.evals: dict[str, deque] = {}  # eval/<suite>/<metric> -> (policy version, value)

    def update(self, rec: dict[str, Any]) -> None:
        rec = clean(rec)  # type: ignore[assignment]
        if rec is None:
            return
        self.records += 1
        kind = rec.get("kind", "step")
        if kind == "env":
            self.envs.append(rec)
            return
        if kind == "eval":  # held-out evaluation (spade_async.eval.inloop)
            version = rec.get("eval/policy_version", rec.get("step", 0))
            for key, v in rec.items():
                if key.count("/") == 2 and key.startswith("eval/") and isinstance(v, (int, float)):
                    self.evals.setdefault(key, deque(maxlen=self.window)).append(
                        (version, float(v))
                    )
            return
        if kind == "event":
            self.events.append(
                f"[{rec.get('level', 'info')}] step {rec.get('step')}: {rec.get('message', '')}"
            )
            return
        if kind != "step":
            return
        step = int(rec.get("step", 0))
        if step <= self.step:  # resumed from an earlier checkpoint
            for dq in (*self.history.values(), self.regret, self.win_rate, self.pace):
                kept = [x for x in dq if x[0] < step]
                dq.clear()
                dq.extend(kept)
            self.prev = None
        else:
            self.prev = self.latest or None
        self.step = step
        self.latest = {k: v for k, v in {**self.latest, **rec}.items() if v is not None}
        for key, v in rec.items():
            if (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and key not in ("step", "time")
            ):
                self.history.setdefault(key, deque(maxlen=self.window)).append((step, v))
        self.regret.extend((step, v) for v in finite(rec.get("regret/values")))
        self.win_rate.extend((step, v) for v in finite(rec.get("win_rate/values")))
        if _number(rec.get("time/elapsed_s")):
            self.pace.append((step, float(rec["time/elapsed_s"])))

    def series(self, key: str) -> list[float]:
        return [v for _, v in self.history.get(key, ())]

    def eta_s(self) -> float | None:
        total = self.latest.get("max_steps")
        if not total or len(self.pace) < 1:
            return None
        (s0, t0), (s1, t1) = (
            (self.pace[0], self.pace[-1]) if len(self.pace) > 1 else ((0, 0.0), self.pace[-1])
        )
        if s1 <= s0 or t1 <= t0:
            return None
        return (int(total) - s1) * (t1 - t0) / (s1 - s0)

    def busy_frac(self, stage: str) -> tuple[float | None, float | None]:
        """(last interval, whole run) fraction of time the stage was busy."""
        cur = self.latest
        b, i = cur.get(f"busy_s/{stage}"), cur.get(f"idle_s/{stage}")
        if b is None or i is None:
            return None, None
        total = b / (b + i) if b + i > 0 else 0.0
        last = None
        p = self.prev
        if p and f"busy_s/{stage}" in p and f"idle_s/{stage}" in p:
            db, di = b - p[f"busy_s/{stage}"], i - p[f"idle_s/{stage}"]
            last = db / (db + di) if db + di > 0 and db >= 0 and di >= 0 else None
        return last, total

    def keys(self, prefix: str, suffix: str = "") -> list[str]:
        out = []
        for k in self.latest:
            if k.startswith(prefix) and k.endswith(suffix):
                out.append(k[len(prefix) : len(k) - len(suffix)])
        return out


class Dashboard:
    """The live view. Thread-safe: rich's refresh thread renders while the loop updates."""

    def __init__(
        self, console: Console | None = None, refresh_hz: float = 4.0, title: str = "SPADE"
    ):
        self.console = console or Console()
        self.refresh_hz = refresh_hz
        self.title = term(title)
        self.state = _State()
        self._lock = threading.Lock()
        self._live = None

    def update(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.state.update(record)

    def reset(self) -> None:
        with self._lock:
            self.state = _State()

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Fold earlier records in (a resumed run shows its history from the start)."""
        for rec in records:
            self.update(rec)

    def note(self, message: str) -> None:
        with self._lock:
            self.state.events.append(f"[note] {term(message)}")

    def start(self) -> None:
        from rich.live import Live

        if self._live is None:
            self._live = Live(
                get_renderable=self.render, console=self.console,
                refresh_per_second=self.refresh_hz,
            )  # fmt: skip
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def render(self) -> RenderableType:
        from spade_async.telemetry import panels

        with self._lock:
            return panels.render(self.state, self.title, self.console.width)


class PlainLogger:
    """One line per step record (and one per event) for logs and non-terminal stdout."""

    def __init__(self, file: TextIO | None = None):
        self.file = file or sys.stdout
        self.state = _State(window=2, values_window=256)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def reset(self) -> None:
        self.state = _State(window=2, values_window=256)

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Fold earlier records in without printing them (the ETA needs their pace)."""
        for rec in records:
            if rec.get("kind", "step") == "step":
                self.state.update(rec)

    def note(self, message: str) -> None:
        print(f"note: {term(message)}", file=self.file, flush=True)

    def update(self, record: dict[str, Any]) -> None:
        record = clean(record)  # type: ignore[assignment]
        if record is None:
            return
        kind = record.get("kind", "step")
        if kind == "event":
            print(
                f"[{record.get('level', 'info')}] step {record.get('step')}: {record.get('message', '')}",
                file=self.file,
                flush=True,
            )
        if kind != "step":
            return
        st = self.state
        st.regret.clear()
        st.win_rate.clear()
        st.update(record)
        print(self.line(), file=self.file, flush=True)

    def line(self) -> str:
        st, r = self.state, self.state.latest
        parts = [f"step {st.step}" + (f"/{r['max_steps']}" if "max_steps" in r else "")]
        if "version" in r:
            parts[0] += f" v{r['version']}"
        parts[0] += f" {hms(r.get('time/elapsed_s'))} eta {hms(st.eta_s())}"
        toks = [f"{role} {fmt(r[f'tokens_per_s/{role}'])}" for role in st.keys("tokens_per_s/")]
        if toks:
            parts.append("tok/s " + " ".join(toks))
        busy = []
        for stage in st.keys("busy_s/"):
            last, total = st.busy_frac(stage)
            frac = last if last is not None else total
            if frac is not None:
                busy.append(f"{stage} {frac:.0%}")
        if busy:
            parts.append("busy " + " ".join(busy))
        streams = [
            f"{n} {r[f'stream/{n}/fill']}/{r.get(f'stream/{n}/capacity', '?')}"
            for n in st.keys("stream/", "/fill")
        ]
        if streams:
            parts.append("streams " + " ".join(streams))
        if "designer/generated" in r:
            parts.append(f"designer valid {r.get('designer/valid', 0)}/{r['designer/generated']}")
        dist = []
        if "regret/mean" in r:
            dist.append(f"regret {fmt(r['regret/mean'])}")
        if st.win_rate:
            dist.append(f"win {sum(v for _, v in st.win_rate) / len(st.win_rate):.2f}")
        for key, name in (("reward/agent_mean", "R_agent"), ("reward/designer_mean", "R_designer")):
            if key in r:
                dist.append(f"{name} {fmt(r[key])}")
        if dist:
            parts.append(" ".join(dist))
        if "memory/size" in r:
            parts.append(
                f"memory {fmt(r['memory/size'])} (dup {fmt(r.get('memory/duplicates', 0))})"
            )
        if "staleness/dropped" in r:
            parts.append(f"stale-dropped {fmt(r['staleness/dropped'])}")
        down = [
            f"engine {i}" for i in st.keys("engine/", "/healthy") if not r[f"engine/{i}/healthy"]
        ]
        if r.get("trainer/healthy") is False:
            down.append("trainer")
        if r.get("router/healthy") is False:
            down.append("router")
        if down or "trainer/healthy" in r:
            parts.append("DOWN: " + ", ".join(down) if down else "health ok")
        return " | ".join(parts)


class NullView:
    """``telemetry.dashboard = "off"``: metrics go to the file and sinks only."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def reset(self) -> None:
        pass

    def replay(self, records: list[dict[str, Any]]) -> None:
        pass

    def update(self, record: dict[str, Any]) -> None:
        pass


def make_view(
    config: TelemetryConfig, console: Console | None = None
) -> Dashboard | PlainLogger | NullView:
    if config.dashboard == "off":
        return NullView()
    console = console or Console()
    if config.dashboard == "on" or console.is_terminal:
        return Dashboard(console, config.refresh_hz)
    return PlainLogger(console.file)
