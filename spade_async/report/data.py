"""What a run directory says, as plain data for the report's figures and tables.

``load_run(path)`` reads everything the run left (``metrics.jsonl``, ``config.toml``,
``memory.lmdb``, ``episodes/records.jsonl`` and ``episodes/replay.json``, ``eval/``) and
lists what is missing or unreadable instead of failing: a partial run (killed mid-step), an
older version's run (no phase meters, no episode records) or a damaged file costs its
section, never the page. The functions below turn a ``Run`` into series; each returns empty
data when its inputs are absent.
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from spade_async.errors import UsageError
from spade_async.telemetry.phases import phase_shares

SYNC_PHASES = ("busy_s/engine", "busy_s/env_pool", "busy_s/trainer")


@dataclass
class Run:
    root: Path
    steps: list[dict[str, Any]] = field(default_factory=list)
    envs: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    memory: list[Any] = field(default_factory=list)  # memory.records.EnvRecord
    episodes: list[Any] = field(default_factory=list)  # episodes.records.EpisodeRecord
    replay: Any = None  # episodes.replay.Summary
    missing: list[str] = field(default_factory=list)
    damaged: str | None = None  # a damaged memory.lmdb: the one line ``spade report`` exits 2 with

    @property
    def name(self) -> str:
        return self.config.get("name") or self.root.name

    @property
    def max_steps(self) -> int | None:
        return self.config.get("max_steps")


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any(
        (path / n).exists() for n in ("config.toml", "metrics.jsonl", "memory.lmdb")
    )


def load_run(path: str | Path) -> Run:
    """Everything readable in ``path``; ``UsageError`` when it is no run directory."""
    root = Path(path)
    if not is_run_dir(root):
        what = "does not exist" if not root.exists() else "is not a run directory"
        raise UsageError(
            f"'{root}' {what}; pass a run directory (it holds config.toml, metrics.jsonl "
            "and memory.lmdb)"
        )
    run = Run(root=root)
    _load_config(run)
    _load_metrics(run)
    _load_memory(run)
    _load_episodes(run)
    return run


def _load_config(run: Run) -> None:
    """The run's settings; a config.toml that is not TOML or holds a value of the wrong
    type is refused as a resume refuses it; keys an older version wrote are ignored."""
    from spade_async.recipe import read_run_config

    path = run.root / "config.toml"
    if not path.is_file():
        run.missing.append("config.toml: absent (the run's settings are unknown)")
        return
    run.config = read_run_config(path)[0]  # wrong type: one line, exit 2; old keys pass


def _load_metrics(run: Run) -> None:
    path = run.root / "metrics.jsonl"
    if not path.is_file():
        run.missing.append("metrics.jsonl: absent (no step was logged)")
        return
    decoder = msgspec.json.Decoder(dict)
    bad = 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = decoder.decode(line)
        except msgspec.DecodeError:
            bad += 1
            continue
        kind = rec.get("kind")
        if not isinstance(rec.get("step"), int):
            bad += 1
        elif kind == "step":
            run.steps.append(rec)
        elif kind == "env":
            run.envs.append(rec)
        elif kind == "eval":
            run.evals.append(rec)
        elif kind == "event":
            run.events.append(rec)
    run.steps = _latest_history(run.steps)
    if bad:
        run.missing.append(f"metrics.jsonl: {bad} unreadable line(s) skipped (torn by a kill?)")
    if not run.steps:
        run.missing.append("metrics.jsonl: no step record (the run stopped before step 1)")
    elif run.max_steps and run.steps[-1]["step"] < run.max_steps:
        run.missing.append(
            f"steps {run.steps[-1]['step'] + 1}-{run.max_steps}: not run (partial run)"
        )


def _latest_history(steps: list[dict]) -> list[dict]:
    """A resumed run logs a step again: the later record of a step wins, history after it
    (from the earlier attempt) is dropped, as the dashboard does."""
    out: list[dict] = []
    for rec in steps:
        while out and out[-1]["step"] >= rec["step"]:
            out.pop()
        out.append(rec)
    return out


def _load_memory(run: Run) -> None:
    if not (run.root / "memory.lmdb" / "data.mdb").is_file():
        run.missing.append("memory.lmdb: absent (no environment archive)")
        return
    from spade_async.memory.integrity import DamagedMemory
    from spade_async.memory.store import open_checked

    try:
        with open_checked(run.root / "memory.lmdb") as store:  # read whole by a child first
            run.memory = list(store.records())
    except Exception as exc:  # a damaged or newer store is data for the page, not a crash
        run.missing.append(f"memory.lmdb: unreadable ({str(exc).splitlines()[0][:200]})")
        if isinstance(exc, DamagedMemory):
            run.damaged = str(exc)


def _load_episodes(run: Run) -> None:
    from spade_async.episodes.records import read_records, read_summary

    run.episodes, bad = read_records(run.root)
    if not run.episodes:
        run.missing.append(
            "episodes/records.jsonl: absent (a run from before episode recording, or none "
            "played): nothing to replay"
        )
    if bad:
        run.missing.append(f"episodes/records.jsonl: {bad} unreadable line(s) skipped")
    run.replay = read_summary(run.root)
    if run.episodes and run.replay is None:
        run.missing.append(
            f"episodes/replay.json: not checked yet (spade episode replay {run.root} --all)"
        )


# -- series -------------------------------------------------------------------------------
def series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a numeric step-record key, skipping records without it."""
    xs, ys = [], []
    for r in run.steps:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def rewards_by_role(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    out = {
        "agent": series(run, "reward/agent_mean"),
        "designer": series(run, "reward/designer_mean"),
    }
    return {k: v for k, v in out.items() if v[0]}


def _threshold(run: Run) -> tuple[float, str]:
    agent = run.config.get("agent", {})
    rewards = run.config.get("rewards", {})
    return float(agent.get("success_threshold", 1.0)), str(rewards.get("win_rate", "mean"))


def window_size(run: Run) -> int:
    return max(1, int(run.config.get("regen_interval", 1) or 1))


def skill_windows(run: Run) -> dict[str, dict[int, dict[str, list[float]]]]:
    """skill -> window index -> {"regret": [...], "win_rate": [...]}, one value per
    environment played in the window, from the episode records (no-hint plays give the win
    rate; with hinted plays too, regret = max(0, mean R(hint) - mean R(no hint)))."""
    from spade_async.rewards import regret, win_rate

    thr, how = _threshold(run)
    skills = {r.id: r.skill or "unspecified" for r in run.memory}
    w = window_size(run)
    plays: dict[tuple[str, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for ep in run.episodes:
        if ep.status in ("env_error", "engine_error", "timeout"):
            continue
        plays[(ep.env_id, ep.step // w)][0 if ep.hinted else 1].append(ep.reward)
    out: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: {"regret": [], "win_rate": []})
    )
    for (env_id, win), (hinted, plain) in sorted(plays.items()):
        if not plain:
            continue
        cell = out[skills.get(env_id, "unspecified")][win]
        cell["win_rate"].append(win_rate(plain, thr, how))
        if hinted:
            cell["regret"].append(regret(hinted, plain))
    return {k: dict(v) for k, v in out.items()}


def step_windows(run: Run) -> dict[str, dict[int, dict[str, list[float]]]]:
    """The same cells from the step records' ``regret/values`` and ``win_rate/values``
    (all skills together): for runs without episode records (an older version)."""
    w = window_size(run)
    cells: dict[int, dict[str, list[float]]] = defaultdict(lambda: {"regret": [], "win_rate": []})
    for r in run.steps:
        for key, name in (("regret/values", "regret"), ("win_rate/values", "win_rate")):
            vals = r.get(key)
            if isinstance(vals, list):
                cells[(r["step"] - 1) // w][name] += [
                    float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)
                ]
    return {"all skills": dict(cells)} if any(c["win_rate"] for c in cells.values()) else {}


def designer_outcomes(run: Run) -> dict[str, int]:
    """Cumulative designer outcomes: valid, rejected at each gate, duplicates, retried."""
    last = run.steps[-1] if run.steps else {}
    out: dict[str, int] = {}
    stages = {k.split("/", 2)[2]: v for k, v in last.items() if k.startswith("designer/stage/")}
    if not stages and run.envs:  # no step yet: count the env records
        stages = dict(Counter(r.get("stage", "?") for r in run.envs))
    out["valid"] = int(stages.pop("ok", last.get("designer/valid", 0)) or 0)
    for stage, n in sorted(stages.items()):
        out[f"rejected: {stage}"] = int(n)
    out["duplicate"] = int(
        last.get("designer/duplicates", sum(bool(r.get("duplicate")) for r in run.envs))
    )
    out["retried"] = int(last.get("designer/retries", sum(r.get("retries", 0) for r in run.envs)))
    return out


def audit_outcomes(run: Run) -> dict[str, int]:
    """Cumulative audits inside training (loop/audits.py): run (by kind), failed and
    quarantined (by reason), skipped, and the untrained samples dropped with them."""
    last = run.steps[-1] if run.steps else {}
    out: dict[str, int] = {}
    for key, label in (("audit/run/solution", "run: solution"), ("audit/run/garbage", "run: garbage"),
                       ("audit/skipped", "skipped")):  # fmt: skip
        if key in last:
            out[label] = int(last[key] or 0)
    for prefix, label in (("audit/failed/", "failed"), ("audit/quarantined/", "quarantined")):
        for k in sorted(k for k in last if k.startswith(prefix)):
            out[f"{label}: {k[len(prefix) :]}"] = int(last[k] or 0)
    if "audit/dropped_samples" in last:
        out["samples dropped"] = int(last["audit/dropped_samples"] or 0)
    return out


def staleness(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    keys = {
        "max agent sample age": "batch/max_agent_age",
        "dropped (cumulative)": "staleness/dropped",
        "IS weight mean": "train/tis_mean",
        "IS weight capped share": "train/tis_capped_frac",
        "ratio mean": "train/ratio_mean",
        "clip fraction": "train/clip_frac",
    }
    out = {label: series(run, k) for label, k in keys.items()}
    spread = ([], [])
    for r in run.steps:  # versions present in one batch: the spread behind the IS weights
        v = r.get("batch/versions")
        if isinstance(v, list) and v:
            spread[0].append(r["step"])
            spread[1].append(float(max(v) - min(v)))
    out["batch version spread"] = spread
    std = ([], [])
    for r in run.steps:  # the importance weights' spread, before any cap (trainer/step.py)
        m, sq = r.get("train/is_weight_mean"), r.get("train/is_weight_sq")
        if isinstance(m, (int, float)) and isinstance(sq, (int, float)):
            std[0].append(r["step"])
            std[1].append(math.sqrt(max(0.0, sq - m * m)))
    out["IS weight std (uncapped)"] = std
    return {k: v for k, v in out.items() if v[0]}


def throughput(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    out = {}
    for role in ("agent", "designer", "hint", "trainer"):
        xs, ys = series(run, f"tokens_per_s/{role}")
        if xs and any(ys):
            out[role] = (xs, ys)
    return out


def phase_series(run: Run) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """component -> phase -> (steps, share over each step's interval)."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    prev = None
    for r in run.steps:
        for comp, shares in phase_shares(r, prev).items():
            for phase, v in shares.items():
                xs, ys = out.setdefault(comp, {}).setdefault(phase, ([], []))
                xs.append(r["step"])
                ys.append(v)
        prev = r
    return out


def overlap(run: Run) -> dict[str, float] | None:
    """Wall time against the sync bound: the same phases' busy time one after another."""
    if not run.steps:
        return None
    last = run.steps[-1]
    wall = last.get("time/elapsed_s")
    parts = {k: last.get(k) for k in SYNC_PHASES}
    if not isinstance(wall, (int, float)) or wall <= 0 or any(v is None for v in parts.values()):
        return None
    bound = float(sum(parts.values()))
    return {"wall_s": float(wall), "sync_bound_s": bound, "overlap": bound / float(wall)}


def mismatch(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    keys = {
        "KL(engine || trainer)": "train/mismatch_kl",
        "max |Δ log p|": "train/mismatch_max",
        "mean |Δ log p|": "train/logprob_gap",
        "MoE routes ≠ engine's (share)": "train/route_mismatch",  # 0 with routing replay
        "MoE router drift (share)": "train/route_drift",
        "MoE routes replayed (share)": "train/route_replayed_share",  # 1.0 with replay
    }
    return {k: v for k, v in ((k, series(run, key)) for k, key in keys.items()) if v[0]}


def archive_sizes(run: Run) -> dict[str, tuple[list[int], list[int]]]:
    """skill -> (steps, valid environments in memory at that step), from the records'
    creation times against the step records' times (step 0: before the first step)."""
    if not run.memory:
        return {}
    times = [float(r["time"]) for r in run.steps]
    steps = [r["step"] for r in run.steps]
    by_skill: dict[str, Counter] = defaultdict(Counter)
    for rec in run.memory:
        if rec.status != "valid":
            continue
        i = bisect.bisect_left(times, rec.created_at)  # made during step steps[i]'s work
        step = steps[i] if i < len(steps) else (steps[-1] + 1 if steps else 0)
        if i == 0 and rec.origin.kind != "designer":
            step = 0  # the initial memory (bundled, imported, a fixed pool)
        by_skill[rec.skill or "unspecified"][step] += 1
    axis = sorted({0, *steps, *(s for c in by_skill.values() for s in c)})
    out = {}
    for skill, counts in sorted(by_skill.items()):
        total, ys = 0, []
        for s in axis:
            total += counts.get(s, 0)
            ys.append(total)
        out[skill] = (axis, ys)
    return out


def top_regret(run: Run, n: int = 5) -> list[Any]:
    played = [r for r in run.memory if r.status == "valid" and r.stats.regret_updates]
    return sorted(played, key=lambda r: (-r.stats.regret, r.id))[:n]


def lineage(run: Run) -> list[tuple[Any, list[Any]]]:
    """(designer environment, the memory records its prompt showed), newest first."""
    by_id = {r.id: r for r in run.memory}
    designed = [r for r in run.memory if r.origin.kind == "designer"]
    designed.sort(key=lambda r: -r.created_at)
    return [(r, [by_id.get(i, i) for i in r.shown]) for r in designed]


def eval_table(run: Run) -> dict[str, dict[int, float]]:
    """'suite/metric' -> policy version -> value (latest record per version)."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for rec in run.evals:
        v = rec.get("eval/policy_version")
        for k, val in rec.items():
            if k.startswith("eval/") and k.count("/") >= 2 and isinstance(val, (int, float)):
                out[k[5:]][int(v) if isinstance(v, int) else -1] = float(val)
    return dict(out)


def replay_share(run: Run) -> dict[str, Any] | None:
    if run.replay is None:
        return None
    s = run.replay
    return {"checked": s.checked, "exact": s.exact, "share": s.share,
            "by_verdict": s.by_verdict, "flagged": s.flagged_envs}  # fmt: skip


# -- compare ------------------------------------------------------------------------------
COMPARE_KEYS = {
    "agent reward (mean)": "reward/agent_mean",
    "designer reward (mean)": "reward/designer_mean",
    "regret (mean)": "regret/mean",
    "agent tokens/s": "tokens_per_s/agent",
    "mismatch KL": "train/mismatch_kl",
    "MoE route mismatch": "train/route_mismatch",
    "MoE routes replayed (share)": "train/route_replayed_share",
}


def interval(
    values: list[float], *, iters: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and a 95% percentile bootstrap interval over ``values`` (one per step)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    if len(x) == 1:
        return float(x[0]), float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    boots = x[rng.integers(0, len(x), size=(iters, len(x)))].mean(axis=1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(x.mean()), float(lo), float(hi)


def compare_rows(a: Run, b: Run) -> list[dict[str, Any]]:
    rows = []
    for label, key in COMPARE_KEYS.items():
        va, vb = series(a, key)[1], series(b, key)[1]
        if va or vb:
            rows.append({"metric": label, "a": interval(va), "b": interval(vb),
                         "n": (len(va), len(vb))})  # fmt: skip
    rows += _eval_compare(a, b)
    return rows


def _latest_eval_dir(run: Run) -> Path | None:
    dirs = []
    for d in (run.root / "eval").glob("v*"):
        if (d / "results.json").is_file() and d.name[1:].isdigit():
            dirs.append((int(d.name[1:]), d))
    return max(dirs)[1] if dirs else None


def _eval_compare(a: Run, b: Run) -> list[dict[str, Any]]:
    """Each shared suite of the two runs' latest evaluations: both scores and B - A with the
    paired bootstrap interval over the problems both answered (spade eval --compare's)."""
    from spade_async.eval.metrics import paired_bootstrap, per_problem
    from spade_async.eval.report import load_results, load_samples

    da, db = _latest_eval_dir(a), _latest_eval_dir(b)
    if da is None or db is None:
        return []
    rows = []
    with contextlib.suppress(Exception):  # an unreadable evaluation costs its rows only
        ra, rb = load_results(da / "results.json"), load_results(db / "results.json")
        for name in [s for s in ra.suites if s in rb.suites]:
            pa = {i: sum(s.score for s in g) / len(g)
                  for i, g in per_problem(load_samples(da / f"{name}.jsonl")).items()}  # fmt: skip
            pb = {i: sum(s.score for s in g) / len(g)
                  for i, g in per_problem(load_samples(db / f"{name}.jsonl")).items()}  # fmt: skip
            diff, lo, hi, n = paired_bootstrap(pa, pb, iters=2000)
            metric = next(iter(ra.suites[name].metrics))
            rows.append({"metric": f"eval {name} {metric}",
                         "a": (ra.suites[name].metrics[metric],) * 3,
                         "b": (rb.suites[name].metrics.get(metric, math.nan),) * 3,
                         "n": (n, n), "diff": (diff, lo, hi)})  # fmt: skip
    return rows
