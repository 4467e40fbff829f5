"""Kernels part: fused linear_logprob and policy_loss vs float64, naive torch and Liger.

Legend: T tokens, V vocabulary, D hidden. Accuracy: each path's outputs and gradients vs the
same inputs promoted to float64 (max |err| and ||out - ref|| / ||ref||); the fused path
passes when its relative error is within 2x the naive path's in the same dtype plus 8 unit
roundoffs of that dtype (both round the logits to the input dtype first). Timing: forward +
backward of -sum(logprob) (Liger: its fused cross-entropy with reduction="sum", the same
loss), median of ``reps`` after a warm-up, and the peak memory above the inputs.
"""

from __future__ import annotations

import importlib.util
import statistics
import time

import torch
from spade_kernels import PolicyTerms, linear_logprob, loss_weights, policy_head, policy_loss
from spade_kernels.reference import linear_logprob_ref

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def _inputs(T, V, D, dtype, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    h = torch.randn(T, D, generator=g, device=dev)
    w = torch.randn(V, D, generator=g, device=dev) * (2.0 / D**0.5)  # logits std ~2
    tgt = torch.randint(0, V, (T,), generator=g, device=dev)
    return h.to(dtype), w.to(dtype), tgt


LIGER_ERROR: list[str] = []


def liger_ce():
    """Liger's fused linear cross-entropy (reduction="sum"), or None (why: LIGER_ERROR)."""
    if importlib.util.find_spec("liger_kernel") is None:
        LIGER_ERROR[:] = ["liger_kernel not installed"]
        return None
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyLoss,
        )
    except Exception as exc:  # noqa: BLE001 - a broken optional comparison is reported
        LIGER_ERROR[:] = [f"{type(exc).__name__}: {exc}"[:300]]
        return None
    mod = LigerFusedLinearCrossEntropyLoss(reduction="sum")
    return lambda h, w, t: mod(w, h, t)


def _paths(device: str, with_liger: bool) -> dict:
    backend = "triton" if device == "cuda" else "torch"
    paths = {
        "fused": lambda h, w, t, ent: linear_logprob(h, w, t, return_entropy=ent, backend=backend),
        "naive": lambda h, w, t, ent: linear_logprob_ref(h, w, t, return_entropy=ent),
    }
    if device == "cuda":
        paths["fused_torch_rows"] = lambda h, w, t, ent: linear_logprob(
            h, w, t, return_entropy=ent, backend="torch"
        )
    lig = liger_ce() if with_liger else None
    if lig is not None:
        paths["liger"] = lambda h, w, t, ent: lig(h, w, t)  # a loss (CE sum), not log-probs
    return paths


def _run(fn, h, w, t, g_lp, g_ent):
    """-> outputs and grads of sum(g_lp * logprob + g_ent * entropy) (liger: of its CE sum)."""
    hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    out = fn(hh, ww, t, g_ent is not None)
    if isinstance(out, torch.Tensor) and out.ndim == 0:  # liger: loss = -sum(logprob)
        out.backward()
        return {"loss": -out.detach(), "grad_h": hh.grad, "grad_w": ww.grad}
    lp, ent = out if g_ent is not None else (out, None)
    total = (lp * g_lp).sum() + ((ent * g_ent).sum() if ent is not None else 0)
    total.backward()
    res = {"logprob": lp.detach(), "grad_h": hh.grad, "grad_w": ww.grad}
    if ent is not None:
        res["entropy"] = ent.detach()
    res["loss"] = lp.detach().sum()
    return res


def _head_run(h, w, t, device):
    T = t.shape[0]
    ones = torch.ones(T, device=device)
    terms = PolicyTerms(loss_weights(ones, "token", loss_scale_denominator=1.0), ones)
    hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    backend = "triton" if device == "cuda" else "torch"
    out = policy_head(hh, ww, t, terms, backend=backend)
    out.loss.backward()
    return {"logprob": out.logprob_T, "grad_h": hh.grad, "grad_w": ww.grad}


def _err(x: torch.Tensor, ref: torch.Tensor) -> dict:
    d = x.double() - ref
    return {
        "max_abs": float(d.abs().max()),
        "rel_l2": float(d.norm() / ref.norm().clamp_min(1e-300)),
    }


def accuracy(device: str, size: dict, dtype: torch.dtype, with_liger: bool) -> dict:
    T, V, D = size["T"], size["V"], size["D"]
    h, w, t = _inputs(T, V, D, dtype, device)
    gen = torch.Generator(device=device).manual_seed(1)
    g_lp = torch.randn(T, device=device, generator=gen)
    g_ent = torch.randn(T, device=device, generator=gen)
    out = {}
    cases = {"logprob_entropy": (g_lp, g_ent), "cross_entropy": (-torch.ones_like(g_lp), None)}
    paths = _paths(device, with_liger)
    u = UNIT_ROUNDOFF[dtype]
    for case, (gl, ge) in cases.items():
        ref = _run(
            lambda a, b, c, e: linear_logprob_ref(a, b, c, return_entropy=e),
            h.double(),
            w.double(),
            t,
            gl.double(),
            None if ge is None else ge.double(),
        )
        res = {}
        for name, fn in paths.items():
            if name == "liger" and ge is not None:
                continue
            try:
                got = _run(fn, h, w, t, gl, ge)
                res[name] = {k: _err(v, ref[k]) for k, v in got.items() if k in ref}
                del got
            except Exception as exc:  # noqa: BLE001 - one broken path, the others still run
                res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if ge is None:  # -sum(logprob)'s gradient == the policy head's at A = 1, ratio 1
            try:
                got = _head_run(h, w, t, device)
                res["head"] = {k: _err(v, ref[k]) for k, v in got.items() if k in ref}
            except Exception as exc:  # noqa: BLE001
                res["head"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        fused, naive = res["fused"], res["naive"]
        res["fused_within_2x_naive"] = (
            "error" not in fused
            and "error" not in naive
            and all(fused[k]["rel_l2"] <= 2 * naive[k]["rel_l2"] + 8 * u for k in fused)
        )
        if "head" in res:
            head = res["head"]
            res["head_within_2x_naive"] = "error" not in head and all(
                head[k]["rel_l2"] <= 2 * naive[k]["rel_l2"] + 8 * u for k in head
            )
        out[case] = res
        del ref
    return out


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timing(device: str, T: int, V: int, D: int, reps: int, with_liger: bool) -> dict:
    """fwd+bwd of one loss over the head: naive/fused(recompute)/fused_torch_rows: -sum(lp);
    liger: its CE sum (the same loss); head: the one-pass policy head on the PPO loss with
    A = 1 on every token, old = the current policy (ratio 1: the gradient is -sum(lp)'s)."""
    h, w, t = _inputs(T, V, D, torch.bfloat16 if device == "cuda" else torch.float32, device)
    ones = torch.ones(T, device=device)
    terms = PolicyTerms(loss_weights(ones, "token", loss_scale_denominator=1.0), ones)
    backend = "triton" if device == "cuda" else "torch"
    paths = dict(_paths(device, with_liger))
    paths["head"] = lambda hh, ww, tt, ent: policy_head(hh, ww, tt, terms, backend=backend).loss
    res = {}
    for name, fn in paths.items():

        def step(fn=fn, name=name):
            hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
            out = fn(hh, ww, t, False)
            loss = out if name in ("liger", "head") else -out.sum()
            loss.backward()

        try:
            step()  # warm-up (Triton compiles here)
            _sync(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            times = []
            for _ in range(reps):
                _sync(device)
                t0 = time.perf_counter()
                step()
                _sync(device)
                times.append(time.perf_counter() - t0)
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda" else None
            res[name] = {
                "fwd_bwd_ms": round(statistics.median(times) * 1e3, 3),
                "peak_extra_mib": None if peak is None else round(peak, 1),
            }
        except Exception as exc:  # noqa: BLE001 - OOM or a broken path: data, not a crash
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            if device == "cuda":
                torch.cuda.empty_cache()
    for name in list(res):
        if name != "naive" and "fwd_bwd_ms" in res[name] and "fwd_bwd_ms" in res.get("naive", {}):
            r, n = res[name], res["naive"]
            r["time_vs_naive"] = round(r["fwd_bwd_ms"] / n["fwd_bwd_ms"], 3)
            if r["peak_extra_mib"] is not None:
                r["memory_vs_naive"] = round(r["peak_extra_mib"] / n["peak_extra_mib"], 4)
    for name in ("fused", "head"):
        if "fwd_bwd_ms" in res.get(name, {}) and "fwd_bwd_ms" in res.get("liger", {}):
            res[name]["time_vs_liger"] = round(
                res[name]["fwd_bwd_ms"] / res["liger"]["fwd_bwd_ms"], 3
            )
    return res


def loss_check(device: str, T: int) -> dict:
    """policy_loss (plain torch, fp32 math by design) on the device vs the same call on CPU:
    value and d loss / d logprob, plus its time on the device."""
    g = torch.Generator().manual_seed(2)
    lp = -torch.rand(T, generator=g) * 5
    old = lp + 0.1 * torch.randn(T, generator=g)
    roll = old + 0.1 * torch.randn(T, generator=g)
    adv = torch.randn(T, generator=g)
    mask = (torch.rand(T, generator=g) < 0.7).float()
    ent = torch.rand(T, generator=g) * 3
    seq = torch.arange(T) // 256
    out = {}
    for agg in ("token", "seq-mean-token-mean"):

        def f(dev, agg=agg):
            x = lp.to(dev, copy=True).requires_grad_(True)
            loss, _ = policy_loss(
                x,
                old.to(dev),
                adv.to(dev),
                mask.to(dev),
                agg=agg,
                rollout_logprob_T=roll.to(dev),
                ref_logprob_T=roll.to(dev),
                kl_coef=0.01,
                entropy_T=ent.to(dev),
                entropy_coef=0.001,
                seq_ids_T=seq.to(dev),
            )
            loss.backward()
            return loss.detach().cpu().double(), x.grad.cpu().double()

        l_dev, g_dev = f(device)
        l_cpu, g_cpu = f("cpu")
        times = []
        for _ in range(5):
            _sync(device)
            t0 = time.perf_counter()
            f(device)
            _sync(device)
            times.append(time.perf_counter() - t0)
        out[agg] = {
            "loss_vs_cpu": _err(l_dev.reshape(1), l_cpu.reshape(1)),
            "grad_vs_cpu": _err(g_dev, g_cpu),
            "fwd_bwd_ms": round(statistics.median(times) * 1e3, 3),
        }
    return out


def kernels_part(ctx: dict, result: dict) -> None:
    device, sizes, log = ctx["device"], ctx["sizes"]["kernels"], ctx["log"]
    with_liger = device == "cuda"
    result["backend"] = "triton" if device == "cuda" else "torch"
    result["liger"] = (liger_ce() is not None or LIGER_ERROR[0]) if with_liger else "cpu: no"
    result["policy_loss"] = loss_check(device, sizes["loss_T"])
    log("kernels: policy_loss checked")
    result["accuracy"] = {}
    failed = []
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        result["accuracy"][name] = _guard(
            failed, accuracy, device, sizes["accuracy"], dtype, with_liger
        )
        log(f"kernels: accuracy {name} done")
    tm = sizes["timing"]
    result["timing"] = {}
    for T in tm["T"]:
        key = f"T{T}"
        result["timing"][key] = _guard(
            failed, timing, device, T, tm["V"], tm["D"], tm["reps"], with_liger
        )
        log(f"kernels: timing T={T} {result['timing'][key]}")
    if failed:
        raise RuntimeError("; ".join(failed))


def _guard(failed: list, fn, device, *args):
    """fn's result, or {"error"} (also appended to ``failed``) so the next section runs."""
    try:
        return fn(device, *args)
    except Exception as exc:  # noqa: BLE001 - reported, the part goes on
        failed.append(f"{fn.__name__}: {type(exc).__name__}: {exc}"[:300])
        return {"error": failed[-1]}
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
