"""The dashboard's panels, each a pure function of the folded state (see dashboard._State).

Called under the dashboard's lock; everything returned is fully built (no lazy views of
the state), so rich may render it after the lock is released.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from spade_async.safe_text import text
from spade_async.telemetry.draw import (
    CURVES,
    GATES,
    KNOWN,
    ROLES,
    STAGES,
    bar,
    bars_from_counts,
    fmt,
    histogram,
    hms,
    sparkline,
)


def _grid(justify: str) -> Table:
    """A borderless table; ``justify`` has one letter per column: l(eft) or r(ight)."""
    t = Table.grid(padding=(0, 1))
    for j in justify:
        t.add_column(justify="right" if j == "r" else "left", no_wrap=True)
    return t


def _ordered(found: list[str], known: tuple[str, ...]) -> list[str]:
    return [k for k in known if k in found] + sorted(k for k in found if k not in known)


def header(st: Any, title: str) -> RenderableType:
    r = st.latest
    total, step = r.get("max_steps"), max(st.step, 0)
    line = Text.assemble(
        (f"{title}  ", "bold"), ("policy v", "dim"), (str(r.get("version", "-")), "bold cyan")
    )
    line.append(f"   step {step}" + (f"/{total}" if total else ""), style="bold")
    if total:
        frac = step / int(total) if int(total) > 0 else 0.0
        line.append("  ")
        line.append_text(bar(frac, 20, "cyan"))
        line.append(f" {frac:.0%}")
    line.append(f"   elapsed {hms(r.get('time/elapsed_s'))}  ETA {hms(st.eta_s())}", style="dim")
    return Panel(line, padding=(0, 1))


def throughput(st: Any) -> Panel:
    t = _grid("lrl")
    for role in _ordered(st.keys("tokens_per_s/"), ROLES):
        key = f"tokens_per_s/{role}"
        t.add_row(
            text(role), fmt(st.latest[key]), Text(sparkline(st.series(key), 16), style="cyan")
        )
    return Panel(t, title="tokens/s", title_align="left")


def stages(st: Any) -> Panel:
    t = _grid("llrl")
    for stage in _ordered(st.keys("busy_s/"), STAGES):
        last, total = st.busy_frac(stage)
        shown = last if last is not None else total or 0.0
        style = "green" if shown >= 0.7 else "yellow" if shown >= 0.3 else "red"
        t.add_row(
            text(stage), bar(shown, 12, style), f"{shown:.0%}",
            Text("run " + ("-" if total is None else f"{total:.0%}"), style="dim"),
        )  # fmt: skip
    r = st.latest
    if "train/push_s" in r:  # the weight push, and how long generation waited for it
        paused = r.get("train/push_paused_s")
        t.add_row("push", f"{r['train/push_s']:.2f} s", "",
                  Text("" if paused is None else f"paused {paused:.2f} s", style="dim"))  # fmt: skip
    return Panel(t, title="busy (last interval)", title_align="left")


_PHASE_STYLE = {"generation": "cyan", "env execution": "yellow", "training": "green",
                "weight push": "magenta", "checkpoint, other": "blue", "busy (unsplit)": "green"}  # fmt: skip


_SHORT = {"generation": "gen", "env execution": "env", "training": "train", "weight push": "push",
          "checkpoint, other": "other", "busy (unsplit)": "busy"}  # fmt: skip


def phases(st: Any) -> Panel | None:
    """Live: each component's phases as a share of the last interval's wall time."""
    from spade_async.telemetry.phases import phase_shares

    shares = phase_shares(st.latest, st.prev) if st.prev else phase_shares(st.latest)
    if not shares:
        return None
    t = _grid("ll")
    width = 20
    for comp, parts in shares.items():
        line, used = Text(), 0
        for phase, share in parts.items():
            if phase == "idle":
                continue
            n = min(width - used, round(share * width))
            line.append("█" * n, style=_PHASE_STYLE.get(phase, "white"))
            used += n
        line.append("·" * (width - used), style="dim")
        busy = " ".join(
            f"{_SHORT.get(p, p)} {v:.0%}" for p, v in parts.items() if p != "idle" and v >= 0.005
        )
        t.add_row(text(comp.replace("sandbox ", "")), line)
        t.add_row("", Text(busy or "idle", style="dim"))
    return Panel(t, title="phase shares (last interval)", title_align="left")


def mismatch(st: Any) -> Panel | None:
    """Live: engine vs trainer log-probs of the sampled tokens, before each update."""
    r = st.latest
    keys = (("train/mismatch_kl", "KL"), ("train/mismatch_max", "max |Δ|"),
            ("train/logprob_gap", "mean |Δ|"), ("train/route_mismatch", "MoE routes ≠"),
            ("train/route_drift", "router drift"),
            ("train/route_replayed_share", "MoE replayed"))  # fmt: skip
    if not any(k in r for k, _ in keys):
        return None
    t = _grid("lrl")
    for key, name in keys:
        if key in r:
            t.add_row(name, fmt(r[key]), Text(sparkline(st.series(key), 16), style="red"))
    return Panel(t, title="train/inference mismatch", title_align="left")


def streams(st: Any) -> Panel:
    t = _grid("llr")
    for name in sorted(st.keys("stream/", "/fill")):
        fill = st.latest[f"stream/{name}/fill"]
        cap = st.latest.get(f"stream/{name}/capacity")
        frac = fill / cap if cap else 0.0
        style = "red" if frac >= 1.0 else "yellow" if frac >= 0.75 or fill == 0 else "green"
        t.add_row(
            text(name), bar(frac, 12, style), text(f"{fill}/{cap if cap is not None else '?'}")
        )
    return Panel(t, title="streams (fill / capacity)", title_align="left")


def designer(st: Any) -> Panel:
    r = st.latest
    gen, valid = r.get("designer/generated", 0), r.get("designer/valid", 0)
    rate = valid / gen if gen else 0.0
    t = _grid("lrrl")
    t.add_row(
        Text("valid", style="bold"),
        f"{fmt(valid)}/{fmt(gen)}",
        f"{rate:.0%}",
        bar(rate, 10, "green"),
    )
    for stage in _ordered(st.keys("designer/stage/"), GATES):
        n = r[f"designer/stage/{stage}"]
        share = n / gen if gen else 0.0
        t.add_row(
            text(stage), fmt(n), f"{share:.0%}", bar(share, 10, "green" if stage == "ok" else "red")
        )
    return Panel(t, title="designer validity by gate", title_align="left")


def distributions(st: Any) -> Panel:
    t = _grid("ll")
    regret = [v for _, v in st.regret]
    if regret:
        hi = max(1.0, max(regret))
        zero = sum(v <= 0 for v in regret) / len(regret)
        t.add_row("regret", Text(f"0[{histogram(regret, 20, 0.0, hi)}]{hi:g}", style="magenta"))
        t.add_row(
            "",
            Text(
                f"n={len(regret)} mean={sum(regret) / len(regret):.2f} zero={zero:.0%}", style="dim"
            ),
        )
    elif isinstance(st.latest.get("regret/hist"), list):
        counts = [int(c) for c in st.latest["regret/hist"]]
        t.add_row("regret", Text(f"0[{bars_from_counts(counts)}]1", style="magenta"))
        t.add_row("", Text(f"n={sum(counts)}", style="dim"))
    wins = [v for _, v in st.win_rate]
    if wins:
        band = sum(0.4 <= v <= 0.6 for v in wins) / len(wins)
        t.add_row("win rate", Text(f"0[{histogram(wins, 20)}]1", style="blue"))
        t.add_row(
            "",
            Text(
                f"n={len(wins)} mean={sum(wins) / len(wins):.2f} in [.4,.6]={band:.0%}", style="dim"
            ),
        )
    return Panel(t, title="regret / win-rate distributions", title_align="left")


def curves(st: Any) -> Panel:
    t = _grid("lrl")
    for key, name in CURVES:
        if key in st.latest:
            t.add_row(name, fmt(st.latest[key]), Text(sparkline(st.series(key), 20), style="green"))
    return Panel(t, title="rewards", title_align="left")


def evaluation(st: Any) -> Panel | None:
    """Held-out evaluation curves over policy versions (``kind = "eval"`` records)."""
    evals = getattr(st, "evals", {})
    if not evals:
        return None
    t = _grid("lrl")
    for key in sorted(evals)[:12]:
        points = list(evals[key])
        t.add_row(text(f"{key[5:]} v{points[-1][0]}"), fmt(points[-1][1]),
                  Text(sparkline([v for _, v in points], 16), style="magenta"))  # fmt: skip
    return Panel(t, title="held-out evaluation", title_align="left")


def health(st: Any) -> Panel:
    r = st.latest
    t = _grid("lr")
    for key, name in (("memory/size", "memory size"), ("memory/duplicates", "duplicates rejected"),
                      ("staleness/dropped", "stale samples dropped"), ("hint/leaks", "hint leaks"),
                      ("trainer/restarts", "trainer restarts"),
                      ("train/lost_batches", "batches lost to a dead trainer"),
                      ("audit/run", "audits run"), ("audit/failed", "audits failed"),
                      ("audit/quarantined", "environments quarantined"),
                      ("audit/dropped_samples", "samples dropped (quarantine)")):  # fmt: skip
        if key in r:
            t.add_row(name, fmt(r[key]))
    for reason in sorted(st.keys("audit/quarantined/")):  # per reason (loop/audits.py)
        t.add_row(text(f"  quarantined: {reason}"), fmt(r[f"audit/quarantined/{reason}"]))

    def dot(ok: Any) -> Text:
        return Text("● up", style="green") if ok else Text("✗ DOWN", style="bold red")

    for i in sorted(st.keys("engine/", "/healthy"), key=lambda s: (len(s), s)):
        t.add_row(text(f"engine {i}"), dot(r[f"engine/{i}/healthy"]))
    if "router/healthy" in r:
        t.add_row("router", dot(r["router/healthy"]))
    if "trainer/healthy" in r:
        t.add_row("trainer", dot(r["trainer/healthy"]))
    return Panel(t, title="memory & health", title_align="left")


def other(st: Any) -> Panel | None:
    keys = sorted(k for k, v in st.latest.items() if k not in ("step", "time", "kind") and not KNOWN.match(k)
                  and isinstance(v, (int, float)) and not isinstance(v, bool))  # fmt: skip
    if not keys:
        return None
    t = _grid("lrl")
    for key in keys[:8]:
        t.add_row(text(key), fmt(st.latest[key]), Text(sparkline(st.series(key), 16), style="cyan"))
    return Panel(t, title="other", title_align="left")


def environments(st: Any) -> Panel:
    t = Table(expand=False, box=None, padding=(0, 1), header_style="dim")
    for col in ("step", "env", "class", "skill", "verdict", "win rate", "regret"):
        t.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            justify="right" if col in ("step", "win rate", "regret") else "left",
        )
    for e in reversed(st.envs):
        ok = e.get("valid")
        verdict = text(e.get("stage", "ok" if ok else "?"), "green" if ok else "red")
        t.add_row(*(text(e.get(k, "")) for k in ("step", "env_id", "env_class", "skill")),
                  verdict, _num(e.get("win_rate")), _num(e.get("regret")))  # fmt: skip
    return Panel(t, title="latest environments", title_align="left")


def _num(v: Any) -> Text:
    """A record's rate or regret: a number to 2 places, else what is there, made safe."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Text(f"{v:.2f}")
    return text("-" if v is None else v)


def render(st: Any, title: str, width: int = 120) -> RenderableType:
    if st.records == 0:
        return Panel(Text("waiting for metrics...", style="dim"), title=text(title))
    panels = [throughput(st), stages(st), streams(st), designer(st), distributions(st), curves(st)]
    panels += [p for p in (phases(st), mismatch(st)) if p is not None]
    panels += [health(st), *([extra] if (extra := other(st)) is not None else [])]
    panels += [ev] if (ev := evaluation(st)) is not None else []
    ncols = 3 if width >= 132 else 2 if width >= 84 else 1
    grid = Table.grid(expand=True)
    for _ in range(ncols):
        grid.add_column(ratio=1)
    for i in range(0, len(panels), ncols):
        row = panels[i : i + ncols]
        grid.add_row(*row, *[""] * (ncols - len(row)))
    rows = [header(st, title), grid, environments(st)]
    if st.events:
        rows.append(Text("\n".join(st.events), style="yellow"))
    return Group(*rows)
