"""LoRA weight pushes: the adapter alone vs the full model, measured on CPU on SmolLM2-135M,
beside the dry run's numbers for the Qwen3-8B shape (plan/memory.py).

    python bench/lora_push.py [--quick] [--save]

One in-process trainer (trainer.lora rank 16 on all seven per-block linears) takes a step,
then pushes to a live CPU engine (``--enable-lora``) both ways: the full merged model by
``/update_weights_from_disk`` and the adapter by ``/load_lora_adapter`` (trainer/lora.py),
each timed; a request naming the adapter is served. Targets (issue 25): adapter payload
<= 1% of a full push, measured here and computed for the 8B shape; trainer memory per GPU
with LoRA <= 40% of full fine-tuning in the 8B dry run (4 H100 ranks, the recipe's 32k
micro-batch and KL reference). The last line printed is one JSON object; ``--save``
writes bench/results/lora_push.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _hw import emit, machine  # noqa: E402


def _bytes(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one push each way")
    p.add_argument("--save", action="store_true", help="write bench/results/lora_push.json")
    args = p.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        from _hw import refuse

        refuse("LoRA needs the 'peft' package (a project dependency): pip install peft")
    import httpx
    import torch

    from spade_async import recipe
    from spade_async.generation.server import make_engine_app, serve_in_thread
    from spade_async.models import resolve_model
    from spade_async.plan.gpus import GPUS
    from spade_async.plan.memory import lora_params, trainer_gpu
    from spade_async.plan.shapes import model_shape
    from spade_async.trainer.batch import Batch, Sample
    from spade_async.trainer.config import LoraConfig, TrainerConfig
    from spade_async.trainer.lora import push_adapter
    from spade_async.trainer.step import Trainer
    from spade_async.trainer.weights import push_disk

    model = resolve_model("smollm2-135m-instruct")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (64,), generator=g).tolist()
    batch = Batch(
        samples=[
            Sample(
                token_ids=ids,
                loss_mask=[0] * 16 + [1] * 48,
                advantage=a,
                rollout_logprobs=[0.0] * 16 + [-2.0] * 48,
            )
            for a in (1.0, -1.0)
        ]
    )
    reps = 1 if args.quick else 3
    runs = {}
    # all seven linears (the recipe default), and q/v only (the LoRA paper's choice)
    for label, lcfg in (
        ("all7", LoraConfig(rank=16)),
        ("q_v", LoraConfig(rank=16, target_modules=("q_proj", "v_proj"))),
    ):
        trainer = Trainer(TrainerConfig(model=str(model), lr=1e-4, lora=lcfg), model)
        app = make_engine_app(str(model), context_length=256, enable_lora=True, max_lora_rank=16)
        full_s, ada_s = [], []
        with tempfile.TemporaryDirectory() as tmp, serve_in_thread(app) as url:
            shm = Path(tmp)
            for _ in range(reps):
                trainer.train_step(batch)
                t0 = time.perf_counter()
                push_disk(trainer, [url], shm_dir=str(shm / "full"))
                full_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                push_adapter(trainer, [url], shm_dir=str(shm / "lora"))
                ada_s.append(time.perf_counter() - t0)
            full_bytes = _bytes(shm / "full", "*.safetensors")
            ada_dir = max((shm / "lora").rglob("lora-v*"), key=lambda d: int(d.name[6:]))
            ada_bytes = _bytes(ada_dir, "*.safetensors")
            served = (
                httpx.post(
                    f"{url}/generate",
                    json={
                        "input_ids": ids[:8],
                        "lora_path": f"spade-v{trainer.version}",
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
                    },
                    timeout=120,
                ).status_code
                == 200
            )
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        runs[label] = {
            "targets": list(lcfg.target_modules),
            "full_push": {"bytes": full_bytes, "seconds": round(med(full_s), 3)},
            "adapter_push": {"bytes": ada_bytes, "seconds": round(med(ada_s), 3), "served": served},
            "payload_ratio": round(ada_bytes / full_bytes, 5),
            "push_time_ratio": round(med(ada_s) / med(full_s), 4),
        }
        del trainer, app
    lora = LoraConfig(rank=16)
    s8 = model_shape("/models/Qwen3-8B")
    pa8 = lora_params(s8, 16, list(lora.target_modules))
    cfg8 = recipe.load(ROOT / "configs" / "qwen3-8b-games.toml")
    kw = dict(
        ranks=4,
        capacity=GPUS["h100-80gb"].memory_bytes,
        tokens=cfg8.trainer.micro_batch_tokens,
        kl_reference=True,
    )
    full8, ada8 = trainer_gpu(s8, **kw), trainer_gpu(s8, **kw, lora=lora)
    computed = pa8 / s8.params
    memory = ada8.trainer / full8.trainer
    out = {
        "hardware": machine(),
        "quick": args.quick,
        "model": "SmolLM2-135M-Instruct (fp32 on CPU), LoRA rank 16",
        "runs": runs,
        "targets": {
            "payload_ratio_measured_smollm2_all7": {
                "target": 0.01,
                "measured": runs["all7"]["payload_ratio"],
                "met": runs["all7"]["payload_ratio"] <= 0.01,
            },
            "payload_ratio_measured_smollm2_q_v": {
                "target": 0.01,
                "measured": runs["q_v"]["payload_ratio"],
                "met": runs["q_v"]["payload_ratio"] <= 0.01,
            },
            "payload_ratio_dry_run_8b_all7": {
                "target": 0.01,
                "measured": round(computed, 5),
                "met": computed <= 0.01,
            },
            "trainer_memory_ratio_dry_run_8b": {
                "target": 0.40,
                "measured": round(memory, 4),
                "met": memory <= 0.40,
            },
        },
    }
    emit(out, "lora_push", args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
