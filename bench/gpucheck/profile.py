"""torch.profiler breakdown of one trainer step: device time per kind of kernel.

Kernels are binned by name (GEMMs cannot be told apart by name: the attention projections,
MLP and head products all land in ``gemm``; the head's own row pass is ``head_rows``).
On CPU the same bins are applied to the ops' self CPU time.
"""

from __future__ import annotations

import torch

BINS = (
    ("head_rows", ("_head_rows", "_row_stats", "_row_grad")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "varlen")),
    ("norms", ("rms", "norm")),
    ("rope", ("rope", "rotary")),
    ("mlp_activation", ("swiglu", "silu", "_swiglu")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("collectives", ("nccl", "all_gather", "reduce_scatter", "allreduce", "all_reduce")),
    (
        "gemm",
        ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm"),
    ),
)


def _bin(name: str) -> str:
    low = name.lower()
    for label, keys in BINS:
        if any(k in low for k in keys):
            return label
    return "other"


def profile_step(step, device: str) -> dict:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if device == "cuda":
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = getattr(e, "self_cuda_time_total", 0)
            if not t or e.key.startswith(("aten::", "cudaLaunch", "Memcpy")) and t == 0:
                continue
        else:
            t = e.self_cpu_time_total
        rows.append((e.key, t / 1e3, e.count))
    total = sum(r[1] for r in rows) or 1.0
    bins: dict[str, float] = {}
    for name, ms, _ in rows:
        bins[_bin(name)] = bins.get(_bin(name), 0.0) + ms
    top = sorted(rows, key=lambda r: -r[1])[:20]
    return {
        "time_kind": "self device time" if device == "cuda" else "self CPU time",
        "total_ms": round(total, 2),
        "bins_ms": {k: round(v, 2) for k, v in sorted(bins.items(), key=lambda kv: -kv[1])},
        "bins_share": {k: round(v / total, 4) for k, v in bins.items()},
        "top": [{"name": n[:120], "ms": round(ms, 3), "calls": c} for n, ms, c in top],
    }
