"""Throughput of a recipe on one 8-GPU node, by placement and ``max_staleness``, simulated.

For each split of the node's GPUs between engines and trainer (2+6, 4+4, 6+2, and
colocated, which the loop runs only under the sync schedule), the recipe runs under the sync
schedule and under the async one at each ``max_staleness``, on the project's own loop in
virtual time (``runtime.simulate``), with roofline costs for that GPU (``costs.gpu_costs``).
A split whose trainer does not fit (``plan.memory``'s own check) is listed as such.

Step time is measured in steady state: from the end of the first step (regeneration and
pipeline fill) to the end of the last, over one regeneration window or more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spade_async import recipe
from spade_async.errors import ConfigError
from spade_async.sim.costs import gpu_costs
from spade_async.sim.runtime import simulate

__all__ = ["SPLITS", "Row", "placement_overrides", "sweep", "format_rows", "faster_placement"]

SPLITS = ("2+6", "4+4", "6+2", "colocated")


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
            extra: list[str], costs_file=None, seed: int = 0) -> Row:  # fmt: skip
    row = Row(split=split, schedule=schedule, staleness=staleness)
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
    if row.note:
        return row
    n_eng = 8 if split == "colocated" else int(split.split("+")[0])
    costs = gpu_costs(
        cfg.model, gpu, engine_gpus=n_eng, tp=tp,
        trainer_gpus=len(cfg.placement.trainer_gpus), colocated=split == "colocated",
        mem_fraction=cfg.engine.mem_fraction_static, kl_reference=cfg.trainer.kl_coef > 0,
        checkpointing=cfg.trainer.activation_checkpointing, costs_file=costs_file,
        push_bytes=push_bytes,
    )  # fmt: skip
    out = simulate(cfg, costs, steps, seed=seed)
    t = out["step_times"]
    span = t[-1] - t[0]
    row.step_s = span / (len(t) - 1) if len(t) > 1 else t[-1]
    samples = out["samples_per_step"][1:] or out["samples_per_step"]
    row.samples_per_hour = sum(samples) / len(samples) * 3600 / row.step_s
    row.engine_busy, row.trainer_busy = out["engine_busy_share"], out["trainer_busy_share"]
    row.controller_cpu_per_step_s = out["controller_cpu_s"] / max(1, out["steps"])
    return row


def sweep(path, gpu: str, *, steps: int = 0, stalenesses=(0, 1, 2, 3), splits=SPLITS,
          extra: list[str] | None = None, costs_file=None, progress=None) -> list[Row]:  # fmt: skip
    """Every split x (sync, async at each staleness); ``steps`` 0: two regeneration windows
    after the first step."""
    extra = list(extra or [])
    base = recipe.load(path, extra)
    steps = steps or 2 * base.regen_interval + 1
    gpu_costs(base.model, gpu, engine_gpus=8, tp=1, trainer_gpus=8, costs_file=costs_file)
    rows = []
    for split in splits:
        sync = run_one(path, gpu, split, "sync", base.max_staleness, steps, extra, costs_file)
        rows.append(sync)
        if progress:
            progress(sync)
        for s in () if split == "colocated" else stalenesses:
            r = run_one(path, gpu, split, "async", s, steps, extra, costs_file)
            if r.step_s and sync.step_s:
                r.over_sync = sync.step_s / r.step_s
            rows.append(r)
            if progress:
                progress(r)
    return rows


def format_rows(rows: list[Row]) -> str:
    head = (f"{'split':<10} {'schedule':<8} {'stale':>5} {'step s':>8} {'samples/h':>10} "
            f"{'engines':>8} {'trainer':>8} {'vs sync':>8}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        stale = r.staleness if r.schedule == "async" else "-"
        if r.step_s is None:
            lines.append(f"{r.split:<10} {r.schedule:<8} {stale:>5} {r.note}")
            continue
        lines.append(
            f"{r.split:<10} {r.schedule:<8} {stale:>5} "
            f"{r.step_s:>8.1f} {r.samples_per_hour:>10.0f} {r.engine_busy:>8.0%} "
            f"{r.trainer_busy:>8.0%} "
            f"{(f'{r.over_sync:.2f}x' if r.over_sync else ''):>8}"
        )
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
