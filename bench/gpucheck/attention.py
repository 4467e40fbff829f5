"""Attention part: one packed row, causal within each sequence: torch's varlen FlashAttention
(``spade_varlen``) vs per-sequence SDPA (``spade_varlen_sdpa``), forward + backward.

Legend: T tokens in the packed row, H query heads, KV key/value heads, d head dim. Both go
through the project's registered attention functions (trainer/attention.py) on the same
q/k/v; the error of the varlen output vs the per-sequence one is reported beside the times.
"""

from __future__ import annotations

import random
import statistics
import time

import torch


def _lengths(total: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out, n = [], 0
    while n < total:
        k = int(min(hi, max(lo, rng.lognormvariate(6.0, 0.9))))
        k = min(k, total - n)
        out.append(k)
        n += k
    return out


def attention_part(ctx: dict, result: dict) -> None:
    from spade_async.trainer import attention

    device, cfg = ctx["device"], ctx["sizes"]["attention"]
    T, H, KV, d = cfg["T"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lens = _lengths(T, cfg["min_len"], cfg["max_len"])
    bounds = [0]
    for n in lens:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, H, T, d, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, KV, T, d, device=device, dtype=dtype, generator=g)
    v = torch.randn(1, KV, T, d, device=device, dtype=dtype, generator=g)
    mod = torch.nn.Module()
    mod.is_causal, mod.num_key_value_groups, mod.scaling = True, H // KV, d**-0.5
    mod.training = True
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
    result.update(T=T, sequences=len(lens), longest=max(lens), dtype=str(dtype))
    result["torch_varlen_available"] = attention.torch_varlen_available()
    fns = {
        "per_sequence_sdpa": lambda a, b, c: attention.varlen_sdpa(
            mod, a, b, c, None, **kw, **{attention.BOUNDS_KEY: tuple(bounds)}
        )[0],
    }
    if device == "cuda" and attention.torch_varlen_available():
        fns["torch_varlen"] = lambda a, b, c: attention.varlen_torch(mod, a, b, c, None, **kw)[0]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    outs = {}
    for name, fn in fns.items():

        def step(fn=fn):
            a, b, c = (x.detach().requires_grad_() for x in (q, k, v))
            out = fn(a, b, c)
            out.float().square().sum().backward()
            return out.detach()

        try:
            outs[name] = step()  # warm-up
            times = []
            for _ in range(cfg["reps"]):
                sync()
                t0 = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - t0)
            result[name] = {"fwd_bwd_ms": round(statistics.median(times) * 1e3, 3)}
        except Exception as exc:  # noqa: BLE001 - one path failing is data
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if "torch_varlen" in outs and "per_sequence_sdpa" in outs:
        a, b = outs["torch_varlen"].double(), outs["per_sequence_sdpa"].double()
        result["varlen_vs_sdpa_rel_l2"] = float((a - b).norm() / b.norm())
        result["varlen_speedup"] = round(
            result["per_sequence_sdpa"]["fwd_bwd_ms"] / result["torch_varlen"]["fwd_bwd_ms"], 3
        )
