"""The held-out validation with drift removed by design: both workloads, both schedules, in
ONE invocation, as short phases interleaved round after round.

Two workers (one per workload: ``two_stage`` and ``three_stage``, ``bench/pipeline.py``'s
settings, engine on core 0 and trainer on core 1, controller on core 0) each open their
runtime once and warm up (one step of each schedule); then, every round, four phases run one
at a time (the idle worker waits on its stdin): two_stage-sync, three_stage-sync,
two_stage-async, three_stage-async, the order rotated by one each round, so that the shared
machine's slow drift (its load moved 5-13 while the earlier runs were made) hits every arm
alike. Each phase records its wall, stage busy times, trained tokens and the 1-minute load
average before and after it.

Each round's phases are then predicted from other phases only
(``spade_async/sim/interleaved.py``, with ``sim/heldout.py``'s functions): a workload's
async phase from its own sync phases of the adjacent rounds (+ the engine contention of its
other rounds), and each workload's sync and async phase from the other workload's sync
phases of the adjacent rounds. Per-round errors, their mean and max, with the load.

    python bench/heldout_interleaved.py [--quick] [--save] [--rounds R] [--phase-steps N]

Default: 8 rounds of 4-step phases (32 phases, ~19 min on these 2 cores when quiet).
``--quick``: 1 round of 1-step phases on the quick workload (the same code path; its
figures are a smoke check, not a validation: ~46 s here, most of it starting 6 processes). ``--save``
writes ``bench/results/pipeline_interleaved.json`` (``--quick``: ``..._quick.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _hw import emit, machine, refuse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOADS = ("two_stage", "three_stage")
ORDER = [(w, s) for s in ("sync", "async") for w in WORKLOADS]
FULL = {"rounds": 8, "phase_steps": 4}
QUICK = {"rounds": 1, "phase_steps": 1}
MARK = "@@interleaved "


def worker(name: str, quick: bool) -> None:
    """One workload's runtime, kept open: reads ``sync N`` / ``async N`` lines on stdin, runs
    that phase, answers one ``MARK`` line of JSON; ``exit`` closes it."""
    import anyio
    import pipeline as P

    from spade_async import recipe
    from spade_async.loop.runtime import open_runtime
    from spade_async.rundir import RunDir
    from spade_async.telemetry.metrics import read_metrics

    three = name == "three_stage"
    sleep_s = P.STEP_SLEEP_S["quick" if quick else "full"] if three else 0.0
    tmp = Path(tempfile.mkdtemp(prefix=f"spade-bench-interleaved-{name}-"))

    def say(obj: dict) -> None:
        print(MARK + json.dumps(obj), flush=True)

    try:
        model, pool = P.workload(tmp, quick, sleep_s)
        look = P.lookahead_steps(three, P.MAX_STALENESS)
        cfg = recipe.load(None, P.overrides(model, pool, quick, look, P.MAX_STALENESS, 0))
        run_dir = RunDir(tmp / "run").create()
        run_dir.write_config(cfg)

        async def go() -> None:
            async with open_runtime(cfg, run_dir) as rt:

                async def no_checkpoint():
                    return None

                rt.checkpoint = no_checkpoint
                await P.run_phase(rt, cfg, "sync", 1)
                await P.run_phase(rt, cfg, "async", 1)
                w = P.QUICK if quick else P.FULL
                say({"ready": name, "workload": {
                    "plays": w["plays"], "turn_tokens": w["turn_tokens"], "name": name,
                    "env_step_sleep_s": sleep_s, "envs": len(P.ENVS), "turns": 2,
                    "lookahead_steps": look, "max_staleness": P.MAX_STALENESS}})  # fmt: skip
                while True:
                    line = (await anyio.to_thread.run_sync(sys.stdin.readline)).split()
                    if not line or line[0] == "exit":
                        return
                    p = await P.run_phase(rt, cfg, line[0], int(line[1]))
                    steps = range(p["first_step"], p["first_step"] + p["steps"])
                    recs = [r for r in read_metrics(run_dir.metrics)
                            if r["kind"] == "step" and r["step"] in steps]  # fmt: skip
                    p.update(
                        trained_tokens=int(sum(r.get("train/tokens", 0) for r in recs)),
                        trained_samples=int(sum(r.get("train/samples", 0) for r in recs)),
                        max_sample_age=max((r.get("batch/max_agent_age", 0) for r in recs),
                                           default=0),
                    )  # fmt: skip
                    say(p)

        anyio.run(go)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Worker:
    def __init__(self, name: str, quick: bool, log: Path):
        self.name, self.log = name, log
        args = [sys.executable, __file__, "--worker", name, *(["--quick"] if quick else [])]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True, env=env)  # fmt: skip

    def answer(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        tail = self.log.read_text()[-2000:]
        raise SystemExit(f"error: the {self.name} worker ended without an answer:\n{tail}")

    def phase(self, schedule: str, steps: int) -> dict:
        self.proc.stdin.write(f"{schedule} {steps}\n")
        self.proc.stdin.flush()
        return self.answer()

    def ask_exit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
            except OSError:
                self.proc.kill()

    def close(self) -> None:
        self.ask_exit()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run(quick: bool, rounds: int, phase_steps: int) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="spade-bench-interleaved-logs-"))
    workers = {w: Worker(w, quick, logs / f"{w}.log") for w in WORKLOADS}
    phases = []
    try:
        ready = {w: k.answer() for w, k in workers.items()}  # both warmed up
        for r in range(rounds):
            order = ORDER[r % len(ORDER) :] + ORDER[: r % len(ORDER)]
            for slot, (w, schedule) in enumerate(order):
                before = os.getloadavg()[0]
                p = workers[w].phase(schedule, phase_steps)
                print(f"round {r} {w:<11} {schedule:<5} {p['wall_s']:7.1f} s  load "
                      f"{before:.1f}", file=sys.stderr, flush=True)  # fmt: skip
                phases.append({**p, "workload": w, "round": r, "slot": slot,
                               "load_avg_1m": [round(before, 2),
                                               round(os.getloadavg()[0], 2)]})  # fmt: skip
    finally:
        for k in workers.values():  # both wind down at once
            k.ask_exit()
        for k in workers.values():
            k.close()
        shutil.rmtree(logs, ignore_errors=True)
    return {"workloads": {w: a["workload"] for w, a in ready.items()}, "phases": phases}


def spread(saved: dict) -> dict:
    """Per workload and schedule: each stage's seconds per step in every round and its
    spread (max / min - 1), the same work each round; and the engine's and trainer's
    async-over-sync slowdown over the whole run, per workload."""
    out: dict = {}
    for w in saved["workloads"]:
        mine = {}
        for sched in ("sync", "async"):
            ph = [p for p in saved["phases"] if p["workload"] == w and p["schedule"] == sched]
            for stage in ("engine", "trainer"):
                per = [p["busy_s"].get(stage, 0.0) / p["steps"] for p in ph]
                mine[f"{sched}_{stage}_s_per_step"] = [round(x, 2) for x in per]
                mine[f"{sched}_{stage}_spread"] = round(max(per) / min(per) - 1, 3)
        for stage in ("engine", "trainer"):
            per_step = {}
            for sched in ("sync", "async"):
                ph = [p for p in saved["phases"] if p["workload"] == w and p["schedule"] == sched]
                busy = sum(p["busy_s"].get(stage, 0.0) for p in ph)
                per_step[sched] = busy / sum(p["steps"] for p in ph)
            mine[f"{stage}_async_over_sync"] = round(per_step["async"] / per_step["sync"], 3)
        out[w] = mine
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="1 round of 1-step quick phases")
    ap.add_argument("--save", action="store_true", help="write bench/results/pipeline_interleaved.json")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=0, help="rounds (default 8; --quick 1)")
    ap.add_argument("--phase-steps", type=int, default=0, help="steps a phase (default 4; --quick 1)")  # fmt: skip
    ap.add_argument("--repredict", action="store_true",
                    help="recompute the predictions from the saved run's phases (no run)")  # fmt: skip
    ap.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.quick)
    size = dict(QUICK if args.quick else FULL)
    for key in ("rounds", "phase_steps"):
        v = getattr(args, key)
        if v < 0:
            refuse(f"--{key.replace('_', '-')} {v}: must be a positive number")
        size[key] = v or size[key]
    from spade_async.sim.heldout import format_heldout, heldout_targets
    from spade_async.sim.interleaved import env_diagnosis, interleaved_rows, interleaved_summary

    t0 = time.perf_counter()
    name = "pipeline_interleaved" + ("_quick" if args.quick else "")
    path = ROOT / "bench" / "results" / f"{name}.json"
    command = "python bench/heldout_interleaved.py" + (" --quick" if args.quick else "") + "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}"
        for k in ("rounds", "phase_steps") if getattr(args, k)
    ) + (" --save" if args.save else "")  # fmt: skip
    if args.repredict:
        if not path.is_file():
            refuse(f"--repredict: no saved run at {path}; run with --save first")
        keep = ("bench", "quick", "hardware", "rounds", "phase_steps", "workloads", "phases",
                "bench_s", "command", "total_s")  # fmt: skip
        saved = {k: v for k, v in json.loads(path.read_text()).items() if k in keep}
        command, total_s = saved.pop("command", command), saved.pop("total_s", None)
    else:
        hw = {**machine(), "placement": "per workload: CPU engine pinned to core 0, trainer "
              "rank to core 1, 1 torch thread each; controller and env workers on core 0"}  # fmt: skip
        saved = {"bench": "heldout_interleaved", "quick": args.quick, "hardware": hw, **size,
                 **run(args.quick, size["rounds"], size["phase_steps"])}  # fmt: skip
        saved["bench_s"] = round(time.perf_counter() - t0, 1)
        if args.save:  # the phases first: a failed prediction loses no measurement
            path.write_text(json.dumps({**saved, "command": command}, indent=2))
    rows = interleaved_rows(ROOT, saved)
    summary = interleaved_summary(rows)
    loads = [x for p in saved["phases"] for x in p["load_avg_1m"]]
    out = {
        **saved,
        "command": command,
        "total_s": total_s if args.repredict else round(time.perf_counter() - t0, 1),
        "load_avg_1m_range": [min(loads), max(loads)],
        "table": format_heldout(rows),
        "heldout": rows,
        "summary": summary,
        "spread": spread(saved),
        # why cross-workload's sync rows miss: the carried environment overhead (in sample)
        "env_diagnosis": env_diagnosis(ROOT, saved),
        # met from the whole run (every round pooled), each round's errors beside it
        "targets": heldout_targets(rows),
    }  # fmt: skip
    for kind, s in summary.items():
        print(f"{kind:<26} pooled max {s['pooled_max_abs']:.1%}; per round: mean |error| "
              f"{s['mean_abs']:.1%}  max {s['max_abs']:.1%}  "
              + " ".join(f"r{e['round']}:{e['workload'][:3]}/{e['arm'][:2]} {e['error']:+.1%}"
                         for e in s["errors"]), file=sys.stderr)  # fmt: skip
    emit(out, name, args.save)


if __name__ == "__main__":
    main()
