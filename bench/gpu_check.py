"""One prepared GPU check: kernels, one FSDP2 NCCL rank, weight export; one JSON line.

On the lent H200 (GPU image: Python 3.12, torch 2.11, triton, transformers; no msgspec or
liger-kernel, which travel as wheels in .whl/, filled here by ``bash bench/gpu_wheels.sh``),
from the repository root:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_check.py --out $OUT

Here (no GPU): ``python bench/gpu_check.py --dry-run`` lists parts and sizes;
``python bench/gpu_check.py --device cpu --quick`` runs the same code at tiny sizes on CPU
(gloo, torch row ops), a smoke test of the logic, not a GPU result. ``make gpu-check``
runs the device command above. docs/gpu-check.md explains every JSON field.

Parts (each under its own try/except and time budget; a failed part reports its error and
the rest still run): ``peak`` (measured bf16 matmul peak), ``kernels`` (the one-pass
policy head, the recompute linear_logprob, policy loss: error vs float64, time and peak
memory vs naive and Liger's fused linear cross-entropy at each T), ``trainer`` (packed
bf16 FSDP2 train steps of a random Qwen3-shaped model through the project's Trainer:
tokens/s, MFU; packed vs padded vs length-sorted; Liger off; the recompute head; one
profiled step), ``export`` (the trainer's ``push_tensor`` path to an engine child process
over CUDA IPC handles), ``attention`` (torch varlen FlashAttention vs per-sequence SDPA on
one packed row), ``moe`` (a small Qwen3-MoE step, grouped_mm vs looped experts),
``sglang`` (skipped unless SGLang imports), ``scale`` (an optimizer-offloaded step and a
LoRA step with its adapter push beside full fine-tuning, tokens/s ratios in the same run,
and one 32k-token packed row with sequence parallel off; gpucheck/scale.py), ``e2e``
(``spade train configs/gpu-smoke.toml``: the trainer on the GPU, the CPU engine on the
host, weights pushed through shared memory; gpucheck/e2e.py). Every part is in the default
run; their budgets add up to 8 minutes at most (``--dry-run`` prints them).
The last stdout line is the JSON, also written to ``--out DIR/gpu_check.json``; the step
profile goes beside it (gpu_check_profile.json).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def make_importable() -> None:
    """Repo root, bench/ and kernels/ on sys.path: ``spade_kernels`` lives in kernels/.

    The root's ``kernels/`` folder has no ``__init__.py`` on purpose: the bare name ``kernels``
    belongs to Hugging Face's package, which transformers imports.
    """
    for p in (str(ROOT), str(BENCH), str(ROOT / "kernels")):
        if p not in sys.path:
            sys.path.insert(0, p)


make_importable()

from gpucheck import sizes as sizes_mod  # noqa: E402

PART_NAMES = ("peak", "kernels", "trainer", "export", "attention", "moe", "sglang", "scale", "e2e")
# every part, in one call: budgets add up to <= 8 minutes of device time (MAX_DEVICE_S), so
# one rerun fits the 15-minute lease with the machine's start-up
DEFAULT_PARTS = PART_NAMES
MAX_DEVICE_S = 8 * 60


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class PartTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise PartTimeout("part ran past its time budget")


def run_part(name: str, fn, ctx: dict, budget_s: int) -> dict:
    """fn(ctx, result) fills ``result`` as it goes, so a failure keeps what was measured."""
    result: dict = {}
    t0 = time.perf_counter()
    log(f"{name}: start (budget {budget_s} s)")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(budget_s)
    try:
        fn(ctx, result)
        result.setdefault("ok", "skipped" not in result)
    except BaseException as exc:  # noqa: BLE001 - a failed part is data, the rest still runs
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"[:600]
        result["where"] = traceback.format_exc(limit=-3)[-1200:]
        log(f"{name}: FAILED {result['error']}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    log(f"{name}: done in {result['seconds']} s")
    return result


def hardware(device: str) -> dict:
    import torch
    from _hw import machine

    hw = {**machine(), "torch": torch.__version__, "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        hw.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    for dist in ("triton", "transformers", "liger-kernel", "flash-attn", "sglang", "msgspec"):
        try:
            hw[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            hw[dist] = None
    return hw


def _get(d: dict, *path):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def summarize(parts: dict) -> dict:
    """The headline numbers, each None when its part failed or did not run."""
    timing = _get(parts, "kernels", "timing") or {}
    t_small = timing[min(timing, key=lambda k: int(k[1:]))] if timing else {}
    t_big = timing[max(timing, key=lambda k: int(k[1:]))] if timing else {}
    acc = _get(parts, "kernels", "accuracy") or {}
    pushes = _get(parts, "export", "pushes") or [{}]
    return {
        "ok": {name: p.get("ok") for name, p in parts.items()},
        "peak_tflops": _get(parts, "peak", "tflops"),
        "kernels_T": min((int(k[1:]) for k in timing), default=None),
        "fused_time_vs_naive": _get(t_small, "fused", "time_vs_naive"),
        "fused_memory_vs_naive": _get(t_small, "fused", "memory_vs_naive"),
        "fused_time_vs_liger": _get(t_small, "fused", "time_vs_liger"),
        "fused_accuracy_ok": all(
            case.get("fused_within_2x_naive") for per in acc.values() for case in per.values()
        )
        if acc
        else None,
        "head_time_vs_naive_small_T": _get(t_small, "head", "time_vs_naive"),
        "head_time_vs_naive_big_T": _get(t_big, "head", "time_vs_naive"),
        "head_time_vs_liger_big_T": _get(t_big, "head", "time_vs_liger"),
        "head_memory_vs_naive_big_T": _get(t_big, "head", "memory_vs_naive"),
        "head_accuracy_ok": all(
            per["cross_entropy"].get("head_within_2x_naive") for per in acc.values()
        )
        if acc and all("cross_entropy" in per for per in acc.values())
        else None,
        "varlen_speedup": _get(parts, "attention", "varlen_speedup"),
        "moe_grouped_speedup": _get(parts, "moe", "grouped_speedup"),
        "moe_replay_step_ratio": _get(parts, "moe", "replay_step_ratio"),  # R3, target <= 1.05
        "packed_vs_liger_off": _get(parts, "trainer", "packed_vs_liger_off"),
        "packed_vs_head_recompute": _get(parts, "trainer", "packed_vs_head_recompute"),
        "train_tokens_per_s": _get(parts, "trainer", "packed", "tokens_per_s"),
        "train_mfu": _get(parts, "trainer", "packed", "mfu"),
        "packed_vs_padded": _get(parts, "trainer", "packed_vs_padded"),
        "packed_vs_padded_sorted": _get(parts, "trainer", "packed_vs_padded_sorted"),
        "export_gb_per_s": pushes[-1].get("gb_per_s"),
        "export_weights_match": _get(parts, "export", "weights_match"),
        "lora_vs_full": _get(parts, "scale", "lora_vs_full"),
        "offload_vs_full": _get(parts, "scale", "offload_vs_full"),
        "long_row_tokens_per_s": _get(parts, "scale", "long_row", "tokens_per_s"),
        "adapter_push_bytes_vs_full": _get(parts, "scale", "adapter_push_bytes_vs_full"),
        "liger": _get(parts, "trainer", "liger"),
        "e2e_versions": _get(parts, "e2e", "versions"),
        "e2e_versions_rise": _get(parts, "e2e", "versions_rise"),
        "e2e_lost_batches": _get(parts, "e2e", "lost_batches"),
        "e2e_trainer_tokens_per_s": _get(parts, "e2e", "trainer_tokens_per_s_warm"),
        "e2e_push_s": _get(parts, "e2e", "push_s_warm"),
    }


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="", help="directory for gpu_check.json (created)")
    p.add_argument("--quick", action="store_true", help="smaller sizes")
    p.add_argument("--dry-run", action="store_true", help="list parts and sizes, run nothing")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma list of parts to run (of {','.join(PART_NAMES)})",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in parts if x not in PART_NAMES]
    if bad:
        print(f"error: unknown part(s) {bad}; pick from {','.join(PART_NAMES)}", file=sys.stderr)
        return 2
    sizes = sizes_mod.pick(args.device, args.quick)
    budget = {p: sizes["budget_s"][p] for p in parts}
    if args.dry_run:
        for p in parts:
            print(f"part {p:<9} budget {budget[p]:>4} s", file=sys.stderr)
        total = sum(budget.values())
        print(
            f"total budget {total} s ({total / 60:.1f} min; limit {MAX_DEVICE_S} s)",
            file=sys.stderr,
        )
        plan = {
            "device": args.device,
            "quick": args.quick,
            "parts": parts,
            "budget_s": budget,
            "total_budget_s": total,
            "sizes": sizes,
        }
        print(json.dumps(plan))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: no CUDA device here; run on the GPU machine, or use --device cpu --quick "
            "(CPU smoke test) or --dry-run",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu" and not args.quick:
        print("error: --device cpu runs only the tiny sizes; add --quick", file=sys.stderr)
        return 2
    from gpucheck import attention, e2e, export, kernels, moe, scale, sglang_part, trainer

    fns = {
        "peak": trainer.peak_part,
        "kernels": kernels.kernels_part,
        "trainer": trainer.trainer_part,
        "export": export.export_part,
        "attention": attention.attention_part,
        "moe": moe.moe_part,
        "sglang": sglang_part.sglang_part,
        "scale": scale.scale_part,  # offload / LoRA steps beside full FT, a 32k packed row
        "e2e": e2e.e2e_part,  # spade train on the GPU config
    }
    t0 = time.perf_counter()
    ctx = {"device": args.device, "sizes": sizes, "log": log}
    out = {"hardware": hardware(args.device), "quick": args.quick, "sizes": sizes, "parts": {}}
    for name in parts:
        out["parts"][name] = run_part(name, fns[name], ctx, sizes["budget_s"][name])
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out["summary"] = summarize(out["parts"])
    line = json.dumps(out, default=str)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(line + "\n")
        if ctx.get("profile"):  # one packed train step, binned by kernel kind
            prof = {"hardware": out["hardware"], "step": "trainer packed", **ctx["profile"]}
            (Path(args.out) / "gpu_check_profile.json").write_text(json.dumps(prof) + "\n")
    # the result is out before teardown: a process group left mid-collective by a timed-out
    # part could hang in destroy_process_group; 20 s, then exit without it
    print(line, flush=True)
    watchdog = threading.Timer(20, os._exit, args=(0,))  # works while C code holds main
    watchdog.daemon = True
    watchdog.start()
    try:
        trainer.close(ctx)
    except Exception:  # noqa: BLE001 - teardown after the result: never fail the run
        pass
    watchdog.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
