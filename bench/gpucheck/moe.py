"""MoE part: a small Qwen3-MoE-shaped model, one forward + backward step with the experts
as transformers' ``grouped_mm`` (what the trainer loads, trainer/model.py experts_kwargs)
vs ``eager`` (a Python loop over experts); the same weights, log-prob error beside times."""

from __future__ import annotations

import statistics
import time

import torch


def moe_part(ctx: dict, result: dict) -> None:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    device, cfg = ctx["device"], ctx["sizes"]["moe"]
    config = Qwen3MoeConfig(**cfg["model"], max_position_embeddings=8192, decoder_sparse_step=1)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = base.state_dict()
    ids = torch.randint(0, config.vocab_size, (1, cfg["T"]), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    lps = {}
    for impl in ("grouped_mm", "eager"):
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, experts_implementation=impl
            )
        model.load_state_dict(state)
        result.setdefault("implementations", {})[impl] = model.config._experts_implementation

        def step(model=model):
            model.zero_grad(set_to_none=True)
            logits = model(ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])
            lp.sum().backward()
            return lp.detach()

        lps[impl] = step()
        times = []
        for _ in range(cfg["reps"]):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        result[impl] = {"step_ms": round(statistics.median(times) * 1e3, 2)}
        del model
    a, b = lps["grouped_mm"].double(), lps["eager"].double()
    result["logprob_rel_l2"] = float((a - b).norm() / b.norm())
    result["grouped_speedup"] = round(
        result["eager"]["step_ms"] / result["grouped_mm"]["step_ms"], 3
    )
    result["params"] = sum(p.numel() for p in base.parameters())
