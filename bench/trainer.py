"""Trainer throughput: packed vs padded micro-batches on a long-tailed length distribution.

    python bench/trainer.py [--quick] [--save] [--model DIR] [--ranks 1,2]

Samples have multi-turn-episode-like lengths (log-normal, median ~256 tokens, clipped to
[32, 3072]: many short episodes, a few very long ones), each with a prompt part and a
trained reply part. The default model is a random Llama shaped like SmolLM2-135M scaled down
(hidden 256, 12 layers, 4 with --quick, vocab 8192): its decoder body, where padding
costs, weighs ~4x its vocab head, which the trainer evaluates only at trained tokens in
every layout. For every world
size (gloo ranks under torchrun, one thread each) and both layouts, the real trainer takes
1 warm-up step and then timed steps through the RPC; tokens/s counts real (non-padding)
tokens. Both padded layouts do what a padded trainer must do to bound memory with the same
token budget: arrival order, k = budget // longest samples per micro-batch; then
``padded_max`` pads every row to the batch's longest (one static shape: verl without
remove_padding) and ``padded`` pads each micro-batch to its own longest (dynamic padding:
OpenRLHF/TRL collators); ``padded_sorted`` sorts by length and fills each micro-batch with as
many samples as keep count x longest within the budget (length-grouped bucketing, the
strongest padded trainer). The target compares packed with the fastest padded layout of
the run; the ratio against each layout is reported beside it. MFU is reported on GPU only.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from _hw import emit, int_list, machine, refuse

from spade_async.models import tiny_model_dir
from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess
from spade_async.trainer.packing import LAYOUTS, plan_microbatches

HERE = Path(__file__).resolve().parent
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12}


def hardware() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        **machine(),
        "gpu": gpu,
        "torch": torch.__version__,
        "backend": "nccl" if gpu else "gloo",
        "threads_per_rank": 1,
        "note": "shared machine; compare the packed/padded ratio, not absolute numbers",
    }


def long_tail_batch(n: int, vocab: int, seed: int) -> Batch:
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        length = int(min(3072, max(32, rng.lognormvariate(5.55, 0.9))))
        prompt = max(8, length // 4)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=mask,
                advantage=rng.gauss(0, 1),
                rollout_logprobs=[-10.8 * m for m in mask],
            )
        )
    return Batch(samples=samples)


def _timed(client, batch: Batch, steps: int, layout: str) -> dict:
    client.train_step(batch, layout=layout)  # warm-up
    t0 = time.perf_counter()
    metrics = [client.train_step(batch, layout=layout) for _ in range(steps)]
    wall = time.perf_counter() - t0
    tokens = sum(m["tokens"] for m in metrics)
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "seconds_per_step": round(wall / steps, 3),
        "micro_batches_per_rank": metrics[-1]["micro_batches"],
        "tokens_per_step": tokens / steps,
    }


def run(model: Path, ranks: int, batch: Batch, steps: int, budget: int) -> dict[str, dict]:
    """One torchrun launch per world size, every layout timed in it."""
    cfg = TrainerConfig(model=str(model), lr=1e-5, micro_batch_tokens=budget, start_timeout_s=300)
    with (
        tempfile.TemporaryDirectory() as run_dir,
        TrainerProcess(cfg, model, run_dir, nproc=ranks, threads=1) as client,
    ):
        return {layout: _timed(client, batch, steps, layout) for layout in LAYOUTS}


def padding_fraction(lens: list[int], ranks: int, budget: int, layout: str) -> float:
    plan = plan_microbatches(
        lens, ranks, budget, packed=layout == "packed", sorted_buckets=layout == "padded_sorted"
    )
    width = max(lens) if layout == "padded_max" else None
    computed = 0
    for rank in plan:
        for mb in rank:
            if layout == "packed":
                computed += sum(lens[i] for i in mb)
            else:
                computed += len(mb) * (width or max((lens[i] for i in mb), default=0))
    return round(1 - sum(lens) / computed, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/trainer.py")
    ap.add_argument("--quick", action="store_true", help="small batch, 1 timed step (< 1 min)")
    ap.add_argument("--save", action="store_true", help="write bench/results/trainer.json")
    ap.add_argument("--model", default="", help="HF model dir (default: a tiny random Llama)")
    ap.add_argument("--ranks", default="1,2", help="world sizes to run, comma separated")
    args = ap.parse_args(argv)
    world_sizes = int_list(args.ranks, "--ranks")
    if args.model and not (Path(args.model) / "config.json").is_file():
        refuse(f"--model {args.model} is not a Hugging Face model directory (no config.json)")
    # Default: a random Llama proportioned like SmolLM2-135M, scaled down: its decoder body
    # costs ~4x its vocab head per token (SmolLM2: 106M body, 28M head), as in every real
    # policy (Qwen3-4B ~9x). Hidden 256, MLP 688, 12 layers, vocab 8192 (random ids). A
    # 49k vocab at hidden 256 would be head-bound, and the head runs only at trained tokens
    # in every layout, so packing would be measured on the part it cannot change.
    # --quick uses 4 layers to stay near a minute on 2 shared cores.
    layers = 4 if args.quick else 12
    vocab = 8192
    model = (
        Path(args.model)
        if args.model
        else tiny_model_dir(
            Path(tempfile.gettempdir()) / f"spade-bench-trainer-256x{layers}-v{vocab}",
            hidden_size=256,
            num_layers=layers,
            intermediate_size=688,
            vocab_size=vocab,
        )
    )
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    n, steps, budget = (8, 1, 1024) if args.quick else (48, 2, 4096)
    batch = long_tail_batch(n, vocab, seed=0)
    lengths = sorted(len(s.token_ids) for s in batch.samples)
    results, ratios, vs = {}, {}, {}
    lens = [len(x.token_ids) for x in batch.samples]
    for ranks in world_sizes:
        timed = run(model, ranks, batch, steps, budget)
        for layout, r in timed.items():
            r["padding_fraction"] = padding_fraction(lens, ranks, budget, layout)
        results[f"ranks_{ranks}"] = timed
        packed = timed["packed"]["tokens_per_s"]
        strongest = max((x for x in timed if x != "packed"), key=lambda x: timed[x]["tokens_per_s"])
        ratios[ranks] = (packed / timed[strongest]["tokens_per_s"], strongest)
        vs[ranks] = {x: round(packed / timed[x]["tokens_per_s"], 2) for x in timed if x != "packed"}
        print(f"ranks={ranks} {json.dumps(timed)}", file=sys.stderr)
    if torch.cuda.is_available():
        params = sum(
            p.numel()
            for p in __import__("transformers")
            .AutoModelForCausalLM.from_pretrained(model)
            .parameters()
        )
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        for key, r in results.items():
            ranks = int(key.split("_")[1])
            flops = 6 * params * r["packed"]["tokens_per_s"]
            r["packed"]["mfu"] = round(flops / (peak * ranks), 4) if peak else None
    worst = min(r for r, _ in ratios.values())
    out = {
        "bench": "trainer",
        "hardware": hardware(),
        "model": str(model),
        "model_shape": {
            k: json.loads((model / "config.json").read_text()).get(k)
            for k in ("hidden_size", "num_hidden_layers", "vocab_size")
        },
        "quick": args.quick,
        "samples": n,
        "micro_batch_tokens": budget,
        "timed_steps": steps,
        "lengths": {
            "min": lengths[0],
            "median": lengths[len(lengths) // 2],
            "p90": lengths[int(0.9 * len(lengths))],
            "max": lengths[-1],
            "total": sum(lengths),
        },
        "results": results,
        "targets": {
            f"packed_vs_strongest_padded_tokens_per_s_ranks_{k}": {
                "target": ">= 1.5x (against the fastest padded layout of this run)",
                "measured": round(v, 2),
                "strongest": name,
                "met": v >= 1.5,
            }
            for k, (v, name) in ratios.items()
        },
        "packed_vs_each_padded_layout": {f"ranks_{k}": v for k, v in vs.items()},
        "all_targets_met": worst >= 1.5,
    }
    emit(out, "trainer", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
