"""A fixed CPU probe: how fast each core ran for a process of ours at one moment, measured
apart from the workload a bench times.

On a shared machine (two cores, other people's processes unpinned beside ours) a pinned
stage gets the share of its core that the other runnable processes leave it, and that share
drifts by tens of percent between runs and within one. ``probe()`` times the same small
deterministic work on each core (a 1-thread torch matmul chain shaped like the tiny model's
MLP, and a pure-Python loop shaped like the controller's text handling) and returns seconds
per repetition; a bench calls it while its own stages are idle (between phases), so it sees
the other processes and not itself. A prediction that divides a cost measured in one run by
that run's probe and multiplies by another run's probe uses no timing of the work it predicts.

``sample()`` adds the 1-minute load average and the per-core CPU time that the whole machine
spent busy (``/proc/stat``) so that drift can be read against load.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

__all__ = ["PROBE", "probe", "sample", "proc_stat", "busy_between", "mean_probe"]

# What one repetition does; saved beside the timings so that a changed probe is never
# compared with an old one.
PROBE = {"version": 1, "torch": "(32x256)@(256x1024)@(1024x256) x 24, fp32, 1 thread",
         "python": "40,000 dict/str operations", "repeats": 6}  # fmt: skip


def _torch_work() -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g)
    up, down = torch.randn(256, 1024, generator=g), torch.randn(1024, 256, generator=g)
    for _ in range(24):
        x = torch.tanh((x @ up) @ down * 0.01)


def _python_work() -> None:
    counts: dict[str, int] = {}
    for i in range(40_000):
        word = "w" + str(i % 97)
        counts[word] = counts.get(word, 0) + len(word)


def _on_core(core: int, repeats: int) -> dict:
    """Both parts ``repeats`` times on ``core`` (this thread pinned there), seconds each."""
    import torch

    os.sched_setaffinity(0, {core})  # this thread only (Linux: pid 0 is the calling thread)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _torch_work(), _python_work()  # first-call costs out of the timing
        out: dict[str, list[float]] = {"torch_s": [], "python_s": []}
        for _ in range(repeats):
            for key, fn in (("torch_s", _torch_work), ("python_s", _python_work)):
                t0 = time.perf_counter()
                fn()
                out[key].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return {k: round(statistics.fmean(v), 5) for k, v in out.items()}


def probe(cores: tuple[int, ...] = (0, 1), repeats: int = PROBE["repeats"]) -> dict:
    """``{"core0": {"torch_s", "python_s"}, ...}``: the mean seconds of one repetition on each
    core, run in a thread of its own (the caller's affinity and torch threads untouched)."""
    result: dict = {}

    def run() -> None:
        for c in cores:
            result[f"core{c}"] = _on_core(c, repeats)

    t = threading.Thread(target=run, name="cpu-probe")
    t.start()
    t.join()
    return result


def proc_stat() -> dict[str, tuple[int, int]]:
    """Per core, (busy, total) clock ticks since boot (``/proc/stat``; busy: all but idle and
    iowait, steal included). Empty where the file is missing."""
    out = {}
    try:
        lines = open("/proc/stat").read().splitlines()
    except OSError:
        return out
    for line in lines:
        head, *vals = line.split()
        if head.startswith("cpu") and head != "cpu":
            ticks = [int(v) for v in vals[:8]]
            idle = ticks[3] + ticks[4]
            out[f"core{head[3:]}"] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_between(a: dict, b: dict) -> dict[str, float]:
    """Each core's busy fraction between two ``proc_stat()`` readings (every process, ours
    included)."""
    return {k: round((b[k][0] - a[k][0]) / max(1, b[k][1] - a[k][1]), 3) for k in a if k in b}


def sample() -> dict:
    """One probe point: the probe, the 1-minute load average, and the time (monotonic)."""
    load = os.getloadavg()[0]
    return {"t": round(time.monotonic(), 2), "load_avg_1m": round(load, 2), **probe()}


def mean_probe(points: list[dict]) -> dict[str, dict[str, float]]:
    """The mean of several probe points, per core and part."""
    cores = sorted({k for p in points for k in p if k.startswith("core")})
    return {c: {part: round(statistics.fmean(p[c][part] for p in points if c in p), 5)
                for part in ("torch_s", "python_s")} for c in cores}  # fmt: skip
