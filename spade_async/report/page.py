"""One self-contained HTML page: inline SVG figures, inline CSS, no script, no network.

Every section is drawn from ``data``'s functions; a section whose inputs are absent says
what is missing, and one that fails to draw (a damaged file) says why, so the page always
renders. Every value from the run (environment code, names, messages, keys) goes through
``esc`` (``safe_text.html_text``): HTML-escaped, and bidirectional or invisible control
characters shown as a marked ``U+XXXX``, so code cannot read differently than it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from spade_async.report import data as D
from spade_async.report import figures as F
from spade_async.safe_text import html_text

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
header{background:#1f3a5f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;opacity:.85}
main{max-width:1280px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;margin:14px 0;padding:10px 16px}
section h2{font-size:16px;margin:4px 0 8px}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid>div{flex:1 1 540px;min-width:0}
.grid svg{max-width:100%;height:auto}
.missing{color:#8a5300;background:#fff6e5;border-left:3px solid #f0a020;padding:4px 10px}
.ok{color:#145a14}.bad{color:#a11}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border-bottom:1px solid #eee;padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:420px;font-size:12px}
details summary{cursor:pointer}code{font-size:12px}
.ctl{color:#fff;background:#a11;border-radius:2px;padding:0 2px;font-size:10px}
.cols{display:flex;gap:16px}.cols>div{flex:1;min-width:0}
"""


def esc(x: Any) -> str:
    """Every value the page writes, keys included: HTML-escaped, bidi and invisible
    controls shown as ``U+XXXX`` (``safe_text.html_text``)."""
    return html_text(x)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return esc(v)


def note(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def grid(figs: list[str]) -> str:
    return '<div class="grid">' + "".join(f"<div>{f}</div>" for f in figs) + "</div>"


def table(head: list[str], rows: list[list[Any]], *, raw: bool = False) -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else _fmt(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


# -- sections -----------------------------------------------------------------------------
def s_rewards(run: D.Run) -> str:
    data = D.rewards_by_role(run)
    if not data:
        return note("no reward in the step records (no step was logged)")
    return grid([F.lines(data, title="mean reward by role", ylabel="reward")])


def s_skills(run: D.Run) -> str:
    windows, prefix = D.skill_windows(run), ""
    if not windows:
        windows = D.step_windows(run)
        if not windows:
            return note("no regret or win rate recorded (no step, or no environment played)")
        prefix = note("per skill needs episodes/records.jsonl and memory.lmdb: all skills "
                      "together, from the step records")  # fmt: skip
    w = D.window_size(run)
    regret = {s: {k: v["regret"] for k, v in c.items()} for s, c in windows.items()}
    rate = {s: {k: v["win_rate"] for k, v in c.items()} for s, c in windows.items()}
    figs = [F.distributions(rate, title="no-hint win rate per environment, by skill",
                            ylabel="win rate", window=w)]  # fmt: skip
    if any(v for c in regret.values() for v in c.values()):
        figs.append(F.distributions(regret, title="regret per environment, by skill",
                                    ylabel="regret", window=w))  # fmt: skip
    return prefix + grid(figs)


def s_designer(run: D.Run) -> str:
    counts, audits = D.designer_outcomes(run), D.audit_outcomes(run)
    figs = []
    if audits:
        figs.append(F.bars(audits, title="audits in training (cumulative)", ylabel="plays / envs"))
    if not any(counts.values()):
        return note("no designer generation recorded (designer off, or no step yet)") + grid(figs)
    outcomes = F.bars(counts, title="designer outcomes (cumulative)", ylabel="generations")
    return grid([outcomes, *figs])


def s_staleness(run: D.Run) -> str:
    data = D.staleness(run)
    if not data:
        return note("no staleness or importance-weight metric in the step records")
    ages = {k: v for k, v in data.items() if k in ("max agent sample age", "batch version spread",
                                                   "dropped (cumulative)")}  # fmt: skip
    weights = {k: v for k, v in data.items() if k not in ages}
    figs = []
    if ages:
        figs.append(F.lines(ages, title="staleness", ylabel="versions / samples"))
    if weights:
        figs.append(F.lines(weights, title="importance weights and clipping", ylabel="value"))
    return grid(figs)


def s_throughput(run: D.Run) -> str:
    data = D.throughput(run)
    if not data:
        return note("no throughput in the step records")
    return grid([F.lines(data, title="tokens per second by role", ylabel="tokens/s")])


def s_phases(run: D.Run) -> str:
    if not run.steps:
        return note("no step record: no phase timing")
    whole = D.phase_shares(run.steps[-1])
    if not whole:
        return note("the step records carry no busy-time meters (an older run)")
    parts = [F.stacked_shares(whole, title="share of wall time, whole run")]
    per = D.phase_series(run)
    busy, style, colors = {}, {}, {}
    for comp, ph in per.items():
        for phase, v in ph.items():
            if phase != "idle":
                key = f"{comp}: {phase}"
                busy[key], style[key] = v, F.COMPONENT_STYLE.get(comp, "-o")
                colors[key] = F.PHASE_COLORS.get(phase, "#7f7f7f")
    if busy and len(run.steps) > 1:
        parts.append(F.lines(busy, title="phase share per step interval", ylabel="share",
                             style=style, colors=colors))  # fmt: skip
    out = grid(parts)
    ov = D.overlap(run)
    if ov:
        out += (
            f"<p>Wall time <b>{ov['wall_s']:.1f} s</b> against a sync bound of "
            f"<b>{ov['sync_bound_s']:.1f} s</b> (engine + sandbox pool + trainer busy time "
            f"one after another): overlap factor <b>{ov['overlap']:.2f}×</b> "
            "(1 = no overlap; above 1 the async schedule ran phases at the same time).</p>"
        )
    if "busy (unsplit)" in whole.get("trainer", {}):
        out += note("trainer busy time is not split into training and weight push "
                    "(a run from before phase meters)")  # fmt: skip
    return out


def s_mismatch(run: D.Run) -> str:
    data = D.mismatch(run)
    if not data:
        return note("no train/inference mismatch metric (train/mismatch_kl) in the step records")
    return grid([F.lines(data, title="engine vs trainer log-probs of the sampled tokens, "
                         "before the update", ylabel="nats", logy=True)])  # fmt: skip


def s_archive(run: D.Run) -> str:
    if not run.memory:
        return note("no environment archive (memory.lmdb absent or empty)")
    sizes = D.archive_sizes(run)
    out = grid([F.lines(sizes, title="valid environments in memory, by skill",
                        ylabel="environments")]) if sizes else ""  # fmt: skip
    top = D.top_regret(run)
    if top:
        out += "<h3>Top-regret environments</h3>"
        for rec in top:
            s = rec.stats
            rate = "-" if s.win_rate_nohint is None else f"{s.win_rate_nohint:.2f}"
            out += (
                f'<details id="env-{esc(rec.id[:12])}"><summary><code>{esc(rec.id[:12])}</code> '
                f"{esc(rec.env_class or '?')} — {esc(rec.skill)} — regret {s.regret:.3f}, "
                f"no-hint win rate {rate}, {s.plays_nohint} plays</summary>"
                f"<pre>{esc(rec.code)}</pre></details>"
            )
    else:
        out += note("no environment has a regret yet (none played with and without hints)")
    lin = D.lineage(run)
    out += "<h3>Lineage: the memory examples each new environment was shown</h3>"
    if not lin:
        out += note("no designer-made environment in memory")
    else:
        rows = []
        for rec, shown in lin[:50]:
            names = ", ".join(
                f"<code>{esc(x.id[:12])}</code> {esc(x.env_class or '')}"
                if hasattr(x, "id") else f"<code>{esc(str(x)[:12])}</code> (not in memory)"
                for x in shown
            ) or "(none: memory off or empty)"  # fmt: skip
            rows.append([f"<code>{esc(rec.id[:12])}</code> {esc(rec.env_class or '')}",
                         esc(rec.status), esc(rec.skill),
                         f"v{esc(rec.origin.policy_version)}", names])  # fmt: skip
        out += table(["environment", "status", "skill", "written by", "shown"], rows, raw=True)
    return out


def s_eval(run: D.Run) -> str:
    tab = D.eval_table(run)
    if not tab:
        return note("no held-out evaluation in this run (eval.interval = 0)")
    versions = sorted({v for col in tab.values() for v in col})
    series = {k: (sorted(v), [v[x] for x in sorted(v)]) for k, v in tab.items()}
    fig = F.lines(series, title="held-out evaluation", xlabel="policy version", ylabel="score")
    rows = [[k, *[col.get(v, "") for v in versions]] for k, col in sorted(tab.items())]
    return grid([fig]) + table(["suite/metric", *[f"v{v}" for v in versions]], rows)


def s_replay(run: D.Run) -> str:
    rs = D.replay_share(run)
    if rs is None and not run.episodes:
        return note("no episode records (episodes/records.jsonl): nothing to replay")
    if rs is None:
        return note(f"{len(run.episodes)} episode(s) recorded, replay not checked yet: "
                    f"spade episode replay {run.root} --all")  # fmt: skip
    cls = "ok" if rs["exact"] == rs["checked"] else "bad"
    out = (f'<p class="{cls}"><b>{rs["share"]:.1%}</b> of {esc(rs["checked"])} episode(s) replay '
           f"exactly ({', '.join(f'{esc(k)}: {esc(v)}' for k, v in rs['by_verdict'].items())}).</p>")  # fmt: skip
    if rs["flagged"]:
        rows = [[f"<code>{esc(k[:12])}</code>", esc(v)] for k, v in sorted(rs["flagged"].items())]
        out += "<p>Memory environments that no longer replay:</p>"
        out += table(["environment", "episodes that differ"], rows, raw=True)
    return out


SECTIONS: list[tuple[str, Callable[[D.Run], str]]] = [
    ("Rewards by role", s_rewards),
    ("Regret and win rate per skill, over windows", s_skills),
    ("Designer outcomes", s_designer),
    ("Staleness and importance weights", s_staleness),
    ("Throughput", s_throughput),
    ("Where the time goes", s_phases),
    ("Train/inference mismatch", s_mismatch),
    ("Environment archive", s_archive),
    ("Held-out evaluation", s_eval),
    ("Episode replay", s_replay),
]


def _section(title: str, fn, run: D.Run) -> str:
    try:
        body = fn(run)
    except Exception as exc:  # damaged input costs this section only
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        run.missing.append(f"section '{title}': could not be drawn ({why})")
        body = note(f"this section could not be drawn from the run's files ({why})")
    return f"<section><h2>{esc(title)}</h2>{body}</section>"


def s_compare(a: D.Run, b: D.Run) -> str:
    rows = D.compare_rows(a, b)
    if not rows:
        return note("the two runs share no metric")
    la, lb = f"A: {a.name}", f"B: {b.name}"
    body = []
    for r in rows:
        ma, lo_a, hi_a = r["a"]
        mb, lo_b, hi_b = r["b"]
        diff = r.get("diff")
        body.append([r["metric"], f"{ma:.4g} [{lo_a:.4g}, {hi_a:.4g}]",
                     f"{mb:.4g} [{lo_b:.4g}, {hi_b:.4g}]",
                     f"{diff[0]:+.4g} [{diff[1]:+.4g}, {diff[2]:+.4g}]" if diff else "",
                     f"{r['n'][0]} / {r['n'][1]}"])  # fmt: skip
    out = table(["metric", la + " mean [95%]", lb + " mean [95%]", "B − A (paired, eval)",
                 "n (steps or problems)"], body)  # fmt: skip
    step_rows = [r for r in rows if "diff" not in r]
    if step_rows:
        out += grid([F.compare_intervals(step_rows, ("A", "B"))])
    pairs = []
    for title, fn in (("agent reward", "reward/agent_mean"), ("mismatch KL", "train/mismatch_kl")):
        sa, sb = D.series(a, fn), D.series(b, fn)
        if sa[0] or sb[0]:
            pairs.append(F.lines({"A": sa, "B": sb}, title=f"{title}: A vs B"))
    return (
        out
        + (grid(pairs) if pairs else "")
        + (
            "<p>Intervals: 95% percentile bootstrap over the run's step records (eval rows: "
            "paired bootstrap over the problems both runs answered).</p>"
        )
    )


def render(run: D.Run, compare: D.Run | None = None) -> str:
    sections = [_section(t, fn, run) for t, fn in SECTIONS]
    if compare is not None:
        sections.append(_section(f"Compared with {compare.name}",
                                 lambda r: s_compare(r, compare), run))  # fmt: skip
        run.missing += [f"{compare.root.name}: {m}" for m in compare.missing]
    last = run.steps[-1] if run.steps else {}
    head = (
        f"{len(run.steps)} step(s)"
        + (f" of {run.max_steps}" if run.max_steps else "")
        + f", policy version {last.get('version', '?')}, "
        f"{len(run.memory)} environment(s) in memory, {len(run.episodes)} episode(s) recorded"
    )
    missing = ""
    if run.missing:
        items = "".join(f"<li>{esc(m)}</li>" for m in run.missing)
        missing = f'<section><h2>Missing or partial</h2><ul class="missing">{items}</ul></section>'
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>spade report: {esc(run.name)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>spade report: {esc(run.name)}</h1><p>{esc(run.root)} — {esc(head)} — "
        f"made {esc(time.strftime('%Y-%m-%d %H:%M'))}</p></header><main>{missing}"
        + "".join(sections)
        + "</main></body></html>"
    )
