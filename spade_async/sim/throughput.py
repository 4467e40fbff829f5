"""Throughput of a recipe on one 8-GPU node, by placement and ``max_staleness``, simulated.

For each split of the node's GPUs between engines and trainer (2+6, 3+5, 4+4, 5+3, 6+2, and
colocated, which the loop runs only under the sync schedule), the recipe runs under the sync
schedule and under the async one at each ``max_staleness``, on the project's own loop in
virtual time (``runtime.simulate``), with roofline costs for that GPU (``costs.gpu_costs``).
A split whose trainer does not fit (``plan.memory``'s own check) runs with the optimizer
offloaded to the host when that is the knob ``plan.memory`` names (its cost from
``sim/extras.py``; the row is starred), else is listed as not fitting.

Step time is measured in steady state, the same way for every arm: the run is cut into
regeneration windows (``regen_interval`` steps); the first window (pipeline fill) and the
last (the tail: the run stops with work in flight) are left out, and the step time is the
mean over the windows between. A row is steady when adding its last measured window moves
that mean less than ``STEADY`` (2%) and, for a ratio, moves the ratio less than 2% too; a row
that is not says so instead of giving a figure.

How long each run is: by default (``steps`` 0, "auto") each row runs window after window
until it is steady (its last ``settle`` = 2 windows each moved its mean < 2%), up to ``cap`` steps (``AUTO_CAP_WINDOWS`` windows), and reports the steps
it used; the check runs at each window's end on the same figures the row then reports (the
loop is stopped there, as on a signal: the steps before are those of a longer run). Only a
row that reaches the cap unsettled says ``not steady at N steps``. A fixed ``steps`` runs
exactly that many. The simulation is repeatable (virtual time, seeded draws, thread
hand-offs inline): the same command gives the same figures.

The headline compares each async row with the *best* sync placement at the same GPU count
(colocated included: ``over_best_sync``) and, beside it, with sync on its own split
(``over_sync``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spade_async import recipe
from spade_async.errors import ConfigError
from spade_async.sim.costs import gpu_costs
from spade_async.sim.runtime import simulate

__all__ = [
    "SPLITS",
    "STEADY",
    "Row",
    "placement_overrides",
    "sweep",
    "format_rows",
    "faster_placement",
    "steady_steps",
    "settled",
    "steady",
    "window_means",
    "window_starts",
    "AUTO_CAP_WINDOWS",
]

SPLITS = ("2+6", "3+5", "4+4", "5+3", "6+2", "colocated")
OFFLOAD = 'trainer.offload = "optimizer"'
STEADY = 0.02  # a mean (or a ratio) that moves less than this with one more window is steady
MIN_WINDOWS = 4  # warm-up + two measured windows + tail
AUTO_CAP_WINDOWS = 16  # "auto": a row still unsettled after this many windows says so


def steady_steps(regen_interval: int, windows: int = 6) -> int:
    """Steps for ``windows`` regeneration windows (and the first step of the next)."""
    return windows * max(1, regen_interval) + 1


def window_starts(designed: list[int], window: int) -> list[int] | None:
    """The step indices (0-based) where a regeneration window started: the steps whose
    record shows the designer's cumulative count grown (the design cycles the run had: under
    async a cycle is ``regen_interval`` versions plus the wait for the design, 5-6 steps at
    ``regen_interval`` 4, so fixed 4-step windows would beat against it). None when the
    designer never ran (a fixed pool): fixed ``window``-step windows."""
    if not designed or not designed[0]:
        return None
    return [i for i, d in enumerate(designed) if i == 0 or d > designed[i - 1]]


def bounds(n: int, window: int, starts: list[int] | None = None) -> list[int]:
    """Window boundaries of an ``n``-step run: window j is steps ``[b[j], b[j+1])``, and
    every window listed is complete (fixed windows: all their steps done; design cycles:
    the next one has started)."""
    if starts is None:
        w = max(1, window)
        return list(range(0, n // w * w + 1, w))
    return [b for b in starts if b < n]


def window_means(step_times: list[float], window: int,
                 starts: list[int] | None = None) -> list[float]:  # fmt: skip
    """Cumulative mean step time after the warm-up window, one value per measured window
    (the first and the last complete windows left out): ``[mean over window 1, over 1-2,
    ...]``, whole windows only; ``starts``: design-cycle windows (``window_starts``), else
    fixed ``window``-step ones. Empty when the run has fewer than ``MIN_WINDOWS`` windows."""
    b = bounds(len(step_times), window, starts)
    k = len(b) - 1
    if k < MIN_WINDOWS:
        return []
    t0 = step_times[b[1] - 1]
    return [(step_times[b[j + 1] - 1] - t0) / (b[j + 1] - b[1]) for j in range(1, k - 1)]


def moved(series: list[float]) -> float | None:
    """How much the last value of ``series`` moved from the one before (None: fewer than 2)."""
    return abs(series[-1] / series[-2] - 1) if len(series) >= 2 else None


def settled(step_times: list[float], window: int, starts: list[int] | None = None,
            windows: int = 1) -> bool:  # fmt: skip
    """At a window's end: the steady mean (``window_means``) moved less than ``STEADY``
    with each of its last ``windows`` measured windows (the test a row's figure is given on;
    2: two windows in a row, so that one window that happens to sit near the mean does not
    settle a row alone)."""
    n = len(step_times)
    if starts is None and n % max(1, window) or starts is not None and starts[-1] != n - 1:
        return False
    return steady(window_means(step_times, window, starts), windows)


def steady(means: list[float], windows: int = 1) -> bool:
    """Each of the last ``windows`` values of ``means`` moved less than ``STEADY``."""
    k = max(1, windows)
    if len(means) < k + 1:
        return False
    return all(moved(means[: len(means) - i]) < STEADY for i in range(k))


@dataclass
class Row:
    split: str
    schedule: str
    staleness: int
    step_s: float | None = None
    samples_per_hour: float | None = None
    engine_busy: float | None = None
    trainer_busy: float | None = None
    over_sync: float | None = None
    note: str = ""
    controller_cpu_per_step_s: float | None = None
    steps: int = 0
    window: int = 1  # steps per regeneration window
    window_s: list[float] | None = None  # cumulative steady mean, one per measured window
    window_steps: list[int] | None = None  # the steps each of those means is over
    steady: bool = False
    cap: int = 0  # "auto": the most steps the row could run (0: a fixed step count)
    moved: float | None = None  # how much the last measured window moved the mean
    over_best_sync: float | None = None
    best_sync: str = ""  # the best sync placement's split
    ratio_by_steps: list[tuple[int, float]] | None = None  # (steps measured, over best sync)
    max_sample_age: int = 0
    mark: str = ""  # "best sync" / "best async"
    offloaded: bool = False  # the trainer fits only with its optimizer on the host


def placement_overrides(
    split: str, tp: int, gpus: int = 8, extra_args: tuple[str, ...] = ()
) -> list[str]:
    """Overrides for ``split``. Colocated as the README's recipe: the engines release their
    memory around each train step (SGLang's memory saver), schedule sync."""
    if split == "colocated":
        eng = [list(range(i, i + tp)) for i in range(0, gpus, tp)]
        args = [*extra_args, *(() if "--enable-memory-saver" in extra_args
                               else ("--enable-memory-saver",))]  # fmt: skip
        return [f"engine.gpus={eng}", f"placement.trainer_gpus={list(range(gpus))}",
                "placement.colocate=true", "placement.release_memory=true",
                f"engine.extra_args={json.dumps(args)}", "schedule='sync'"]  # fmt: skip
    n_eng = int(split.split("+")[0])
    eng = [list(range(i, i + tp)) for i in range(0, n_eng - n_eng % tp, tp)]
    if not eng:
        raise ConfigError(f"split {split}: fewer engine GPUs than one engine's TP ({tp})")
    return [f"engine.gpus={eng}", f"placement.trainer_gpus={list(range(n_eng, gpus))}",
            "placement.colocate=false"]  # fmt: skip


def current_split(cfg) -> str:
    if cfg.placement.colocate:
        return "colocated"
    n = sum(len(g) for g in cfg.engine.gpus)
    return f"{n}+{len(cfg.placement.trainer_gpus)}"


def _fits(cfg, gpu: str) -> tuple[str, int]:
    """('' or why the trainer does not fit, the bytes one push sends), from plan.memory."""
    from spade_async.plan import gpu_by_name, model_shape, plan_memory

    shape = model_shape(cfg.model)
    if shape is None:
        return "", 0
    plan = plan_memory(cfg, shape, gpu_by_name(gpu))
    why = "" if plan.trainer.fits else f"trainer does not fit ({plan.knob or 'memory'})"
    return why, plan.push_bytes


def run_one(path, gpu: str, split: str, schedule: str, staleness: int, steps: int,
            extra: list[str], costs_file=None, seed: int = 0, offload: bool = True,
            auto: bool = False, settle: int = 1) -> Row:  # fmt: skip
    """One placement x schedule; a trainer that fits only with the optimizer offloaded runs
    so (``offload``), its host round trip costed (``sim/extras.py``). ``auto``: ``steps`` is
    the cap, and the run stops at the first window's end where it is ``settled`` (over
    ``settle`` windows in a row)."""
    row = Row(split=split, schedule=schedule, staleness=staleness, cap=steps if auto else 0)
    base = recipe.load(path, list(extra))
    tp = max(1, len(base.engine.gpus[0])) if base.engine.gpus else 1
    sets = [*extra, f"schedule='{schedule}'", f"max_staleness={staleness}"]
    try:
        where = placement_overrides(split, tp, extra_args=tuple(base.engine.extra_args))
        cfg = recipe.load(path, [*sets, *where])
    except ConfigError as e:
        row.note = str(e).split(":")[0][:60]
        return row
    row.note, push_bytes = _fits(cfg, gpu)
    if row.note and OFFLOAD in row.note and offload:  # the knob plan.memory names: take it
        cfg = recipe.load(path, [*sets, *where, "trainer.offload='optimizer'"])
        row.note, push_bytes = _fits(cfg, gpu)
        row.offloaded = not row.note
    if row.note:
        return row
    n_eng = 8 if split == "colocated" else int(split.split("+")[0])
    costs = gpu_costs(
        cfg.model, gpu, engine_gpus=n_eng, tp=tp,
        trainer_gpus=len(cfg.placement.trainer_gpus), colocated=split == "colocated",
        mem_fraction=cfg.engine.mem_fraction_static, kl_reference=cfg.trainer.kl_coef > 0,
        checkpointing=cfg.trainer.activation_checkpointing, costs_file=costs_file,
        push_bytes=push_bytes, offload=cfg.trainer.offload == "optimizer",
    )  # fmt: skip
    w = max(1, cfg.regen_interval)
    until = (lambda t, d: settled(t, w, window_starts(d, w), settle)) if auto else None
    out = simulate(cfg, costs, steps, seed=seed, until=until)
    t, starts = out["step_times"], window_starts(out["designed"], w)
    row.steps, row.window, row.window_s = len(t), w, window_means(t, w, starts)
    b = bounds(len(t), w, starts)
    row.window_steps = [b[j + 1] - b[1] for j in range(1, len(row.window_s) + 1)]
    row.max_sample_age = out["max_sample_age"]
    if not row.window_s:
        row.note = (f"too short for a steady state: {len(t)} steps, need "
                    f"{MIN_WINDOWS * w} (--steps)")  # fmt: skip
        return row
    move = row.moved = moved(row.window_s)
    row.steady = steady(row.window_s, settle)
    if not row.steady:
        more = "the cap: more --cap" if auto else "more --steps"
        row.note = f"not steady at {len(t)} steps (last window moved {move:.1%}): {more}"
        return row
    row.step_s = row.window_s[-1]
    samples = out["samples_per_step"][b[1] : b[1] + row.window_steps[-1]]
    row.samples_per_hour = sum(samples) / len(samples) * 3600 / row.step_s
    row.engine_busy, row.trainer_busy = out["engine_busy_share"], out["trainer_busy_share"]
    row.controller_cpu_per_step_s = out["controller_cpu_s"] / max(1, out["steps"])
    return row


def sweep(path, gpu: str, *, steps: int = 0, stalenesses=(0, 1, 2, 3), splits=SPLITS,
          extra: list[str] | None = None, costs_file=None, progress=None,
          jobs: int = 1, cap: int = 0, settle: int = 2) -> list[Row]:  # fmt: skip
    """Every split x (sync, async at each staleness); ``steps`` 0: "auto", each row until
    it is steady or ``cap`` steps (0: ``AUTO_CAP_WINDOWS`` regeneration windows and a step);
    ``settle``: windows in a row that must each move a row's mean less than ``STEADY``;
    ``jobs`` > 1: that many simulations at once, each in a process of its own (virtual
    time: the figures do not depend on it)."""
    extra = list(extra or [])
    base = recipe.load(path, extra)
    auto = not steps
    steps = steps or cap or steady_steps(base.regen_interval, AUTO_CAP_WINDOWS)
    gpu_costs(base.model, gpu, engine_gpus=8, tp=1, trainer_gpus=8, costs_file=costs_file)
    tail = (0, True, auto, settle)  # seed, offload, auto, settle
    tasks = [(str(path), gpu, split, "sync", base.max_staleness, steps, extra, costs_file, *tail)
             for split in splits]  # fmt: skip
    tasks += [(str(path), gpu, split, "async", s, steps, extra, costs_file, *tail)
              for split in splits if split != "colocated" for s in stalenesses]  # fmt: skip
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(run_one, *t) for t in tasks]
            done = []
            for f in futures:
                done.append(f.result())
                if progress:
                    progress(done[-1])
    else:
        done = []
        for t in tasks:
            done.append(run_one(*t))
            if progress:
                progress(done[-1])
    by = {(r.split, r.schedule, r.staleness if r.schedule == "async" else -1): r for r in done}
    rows = []
    for split in splits:
        sync = by[(split, "sync", -1)]
        rows.append(sync)
        for s in () if split == "colocated" else stalenesses:
            r = by[(split, "async", s)]
            if r.step_s and sync.step_s:
                r.over_sync = sync.step_s / r.step_s
            rows.append(r)
    compare(rows)
    return rows


def compare(rows: list[Row]) -> None:
    """Each async row over the best steady sync row: steady when one more window of each
    (their last measured ones) moved the ratio less than ``STEADY``; the ratio against steps
    over the windows both measured; the best sync and async rows marked."""
    syncs = [r for r in rows if r.schedule == "sync" and r.step_s]
    if not syncs:
        return
    best = min(syncs, key=lambda r: r.step_s)
    best.mark = "best sync"
    for r in rows:
        if r.schedule != "async" or not r.step_s:
            continue
        n = min(len(r.window_s), len(best.window_s))
        ratios = [best.window_s[j] / r.window_s[j] for j in range(n)]
        at = r.window_steps or [(j + 1) * r.window for j in range(n)]
        r.ratio_by_steps = [(at[j], round(x, 3)) for j, x in enumerate(ratios)]
        m = moved([best.window_s[-2] / r.window_s[-2], best.window_s[-1] / r.window_s[-1]])
        if m is None or m >= STEADY:
            r.note = f"ratio not steady at {r.steps} steps: more --steps"
            continue
        r.over_best_sync, r.best_sync = best.step_s / r.step_s, best.split
    asyncs = [r for r in rows if r.schedule == "async" and r.over_best_sync]
    if asyncs:
        min(asyncs, key=lambda r: r.step_s).mark = "best async"


def format_rows(rows: list[Row]) -> str:
    head = (f"{'split':<10} {'schedule':<8} {'stale':>5} {'steps':>5} {'step s':>8} {'samples/h':>10} "
            f"{'engines':>8} {'trainer':>8} {'vs best':>8} {'vs same':>8}  ")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        stale = r.staleness if r.schedule == "async" else "-"
        split = r.split + ("*" if r.offloaded else "")
        if r.step_s is None:
            lines.append(f"{split:<10} {r.schedule:<8} {stale:>5} {r.steps or '':>5} {r.note}")
            continue
        lines.append(
            f"{split:<10} {r.schedule:<8} {stale:>5} {r.steps:>5} "
            f"{r.step_s:>8.1f} {r.samples_per_hour:>10.0f} {r.engine_busy:>8.0%} "
            f"{r.trainer_busy:>8.0%} "
            f"{(f'{r.over_best_sync:.2f}x' if r.over_best_sync else ''):>8} "
            f"{(f'{r.over_sync:.2f}x' if r.over_sync else ''):>8}"
            + (f"  <- {r.mark}" if r.mark else (f"  {r.note}" if r.note else ""))
        )
    if any(r.offloaded for r in rows):
        lines.append("* optimizer offloaded to the host (the trainer fits no other way)")
    return "\n".join(lines)


def faster_placement(rows: list[Row], split: str, schedule: str, staleness: int) -> str:
    """A line naming a placement > 10% faster than the recipe's own, or ''."""
    mine = [r for r in rows if r.split == split and r.schedule == schedule
            and (schedule == "sync" or r.staleness == staleness) and r.step_s]  # fmt: skip
    done = [r for r in rows if r.step_s]
    if not mine or not done:
        return ""
    best = min(done, key=lambda r: r.step_s)
    if best.step_s < 0.9 * mine[0].step_s:
        how = f"{best.split}, {best.schedule}" + (
            f", max_staleness {best.staleness}" if best.schedule == "async" else ""
        )
        return (f"faster: {how}: {best.step_s:.0f} s a step against the recipe's "
                f"{mine[0].step_s:.0f} s ({mine[0].step_s / best.step_s:.2f}x)")  # fmt: skip
    return ""
