"""The async schedule's lab: one placement row of a recipe in the simulator
(``sim/throughput.run_one``: the loop's own schedule in virtual time), a pipeline option
off and on, same recipe, seed and steps, and where the engines' time goes.

    python bench/async_lab.py [--quick] [--split 6+2] [--staleness 1] [--steps 25]
        [--option pipeline.regen_overlap] [--seeds 0] [--set KEY=VALUE] [--probe] [--save]
        [--tag NAME]

Each arm reports its steady-state step time (``sim/throughput``: first and last
regeneration windows left out), engine and trainer busy shares, the engines' mean batch,
the staleness figures (largest trained sample age, episodes dropped as stale) and the step
times one by one. ``--probe`` also samples every engine each virtual 0.25 s and names why
an engine is idle: held for a weight push, the producer waiting on admission, a
regeneration or hints in progress (the sampler's timers can reorder ties, so a probed run's
step time is not the unprobed one's). The last line is one JSON object: each arm, the on/off
step-time ratio per seed, and the target (on faster than off, no staleness figure worse).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _hw import machine, refuse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RECIPE = ROOT / "configs" / "qwen3-8b-games.toml"
DT = 0.25  # the probe's sampling period, virtual seconds


def _install_probe() -> tuple[collections.Counter, list]:
    """Wrap the producer's phases and the simulated engines to attribute engine time."""
    import anyio

    from spade_async.loop import cycle
    from spade_async.loop import schedule_async as sa
    from spade_async.sim import engine as sim_engine

    phase: collections.Counter = collections.Counter()
    share: collections.Counter = collections.Counter()
    engines: list = []

    def tracked(name, fn):
        async def wrapper(*a, **k):
            phase[name] += 1
            try:
                return await fn(*a, **k)
            finally:
                phase[name] -= 1

        return wrapper

    cycle.regenerate = tracked("regen", cycle.regenerate)
    cycle.window_hints = tracked("hints", cycle.window_hints)
    admit = sa.Admission.admit
    sa.Admission.admit = lambda self, f: tracked("admission", admit)(self, f)
    init, run = sim_engine.SimEngine.__init__, sim_engine.SimEngine.run

    def new_init(self, *a, **k):
        init(self, *a, **k)
        engines.append(self)

    async def sampler():
        while True:
            await anyio.sleep(DT)
            for e in engines:
                if e.held:
                    k = "held for a weight push"
                elif e.running:
                    k = "busy"
                    share["seq_s"] += len(e.running) * DT
                elif phase["regen"]:
                    k = "idle: regeneration in progress"
                elif phase["hints"]:
                    k = "idle: hints in progress"
                elif phase["admission"]:
                    k = "idle: producer waits on admission"
                else:
                    k = "idle: other"
                share[k] += DT
            share["total_s"] += DT * len(engines)
            if phase["regen"]:
                share["regen_phase_s"] += DT
                share["regen_phase_seq_s"] += DT * sum(len(e.running) for e in engines)

    async def new_run(self):
        if self is not engines[0]:
            return await run(self)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler)
            await run(self)

    sim_engine.SimEngine.__init__, sim_engine.SimEngine.run = new_init, new_run
    return share, engines


def arm(split: str, staleness: int, steps: int, extra: list[str], seed: int, probe: bool) -> dict:
    """One simulated row (in a process of its own: the probe patches modules)."""
    from spade_async.sim import throughput

    share, engines = _install_probe() if probe else (None, [])
    cap: dict = {}
    simulate = throughput.simulate

    def keep(*a, **k):
        out = simulate(*a, **k)
        cap.update(out)
        return out

    throughput.simulate = keep
    t0 = time.perf_counter()
    r = throughput.run_one(RECIPE, "h100-80gb", split, "async", staleness, steps, extra, seed=seed)
    times = cap.get("step_times", [])
    out = {
        "split": split, "staleness": staleness, "seed": seed, "overrides": extra,
        "step_s": round(r.step_s, 2) if r.step_s else None, "note": r.note,
        "window_means_s": [round(x, 2) for x in r.window_s or []],
        "engine_busy": round(cap.get("engine_busy_share", 0), 4),
        "trainer_busy": round(cap.get("trainer_busy_share", 0), 4),
        "engine_mean_batch": round(cap.get("engine_mean_batch", 0), 2),
        "max_sample_age": cap.get("max_sample_age", 0),
        "staleness_dropped": cap.get("staleness_dropped", 0),
        "step_deltas_s": [round(b - a, 1) for a, b in zip([0.0, *times], times, strict=False)],
        "real_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    if probe and share:
        total = share.pop("total_s") or 1.0
        seq_s, busy = share.pop("seq_s"), share.get("busy", 0.0) or 1.0
        regen_s, regen_seq = share.pop("regen_phase_s"), share.pop("regen_phase_seq_s")
        out["engine_time"] = {k: round(v / total, 4) for k, v in sorted(share.items())}
        out["running_per_busy_engine"] = round(seq_s / busy, 1)
        out["regen_phase_s"] = round(regen_s, 1)
        out["running_per_engine_in_regen"] = round(regen_seq / max(1e-9, regen_s) / max(1, len(engines)), 1)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="9 steps, one seed (not steady)")
    ap.add_argument("--split", default="6+2")
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--option", default="pipeline.regen_overlap",
                    help="a boolean pipeline option: each seed runs it false and true")  # fmt: skip
    ap.add_argument("--seeds", default="0", help="comma-separated simulator seeds")
    ap.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE")
    ap.add_argument("--probe", action="store_true", help="attribute engine idle time")
    ap.add_argument("--jobs", type=int, default=2, help="arms run at once (processes)")
    ap.add_argument("--save", action="store_true",
                    help="bench/results/async_lab_<option>_s<staleness>[_<tag>].json")  # fmt: skip
    ap.add_argument("--tag", default="", help="appended to the saved file's name")
    args = ap.parse_args()
    if "=" in args.option or not args.option.startswith("pipeline."):
        refuse(f"--option {args.option!r}: name a boolean pipeline option, e.g. "
               "pipeline.regen_overlap (each arm sets it false, then true)")  # fmt: skip
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        refuse(f"--seeds {args.seeds!r}: give whole numbers separated by commas, e.g. 0,1")
    steps = 9 if args.quick else args.steps
    if args.quick:
        seeds = seeds[:1]
    tasks = [(args.split, args.staleness, steps, [*args.extra, f"{args.option}={on}"], seed,
              args.probe) for seed in seeds for on in ("false", "true")]  # fmt: skip
    t0 = time.perf_counter()
    import multiprocessing as mp

    with ProcessPoolExecutor(max(1, args.jobs), mp_context=mp.get_context("spawn")) as pool:
        arms = list(pool.map(arm, *zip(*tasks, strict=True)))
    for a in arms:
        print(json.dumps({k: v for k, v in a.items() if k != "step_deltas_s"}), file=sys.stderr)
    pairs = []
    for seed in seeds:
        off, on = (a for a in arms if a["seed"] == seed)
        ratio = off["step_s"] / on["step_s"] if off["step_s"] and on["step_s"] else None
        pairs.append({"seed": seed, "off_step_s": off["step_s"], "on_step_s": on["step_s"],
                      "off_over_on": round(ratio, 4) if ratio else None,
                      "max_sample_age": [off["max_sample_age"], on["max_sample_age"]],
                      "staleness_dropped": [off["staleness_dropped"], on["staleness_dropped"]]})  # fmt: skip
    ratios = [p["off_over_on"] for p in pairs if p["off_over_on"]]
    no_worse = all(p["max_sample_age"][1] <= p["max_sample_age"][0] for p in pairs)
    out = {
        "bench": "async_lab",
        "command": "python bench/async_lab.py " + " ".join(sys.argv[1:]),
        "hardware": machine(),
        "total_s": round(time.perf_counter() - t0, 1),
        "option": args.option, "split": args.split, "staleness": args.staleness,
        "steps": steps, "pairs": pairs, "arms": arms,
        "targets": {"option_faster_no_staler": {
            "target": "on faster than off at every seed, max sample age no higher",
            "measured": {"off_over_on": ratios, "max_age_no_higher": no_worse},
            "met": bool(ratios) and min(ratios) > 1.0 and no_worse}},
    }  # fmt: skip
    if args.save:
        tag = f"_{args.tag}" if args.tag else ""
        name = f"async_lab_{args.option.split('.')[-1]}_s{args.staleness}{tag}.json"
        (ROOT / "bench" / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
