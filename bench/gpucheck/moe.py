"""MoE part: a small Qwen3-MoE-shaped model, one forward + backward step with the experts
as transformers' ``grouped_mm`` (what the trainer loads, trainer/model.py experts_kwargs)
vs ``eager`` (a Python loop over experts); the same weights, log-prob error beside times.
``replay``: the grouped step with routing replay (every token's recorded experts, R3)
against the same step without; issue 35's target is a ratio <= 1.05."""

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
        if impl == "grouped_mm":
            result["replay"] = _replay(model, ids, step, cfg["reps"], sync, device)
        del model
    a, b = lps["grouped_mm"].double(), lps["eager"].double()
    result["logprob_rel_l2"] = float((a - b).norm() / b.norm())
    result["grouped_speedup"] = round(
        result["eager"]["step_ms"] / result["grouped_mm"]["step_ms"], 3
    )
    result["params"] = sum(p.numel() for p in base.parameters())
    result["replay_step_ratio"] = result["replay"]["ratio"]


def _replay(model, ids, step, reps: int, sync, device: str) -> dict:
    """Routing replay (trainer/routing.py) on the grouped experts: the step with every
    token's recorded experts swapped in and re-weighted, against the same step without."""
    from types import SimpleNamespace

    from spade_async.generation.route_capture import RouteCapture
    from spade_async.generation.routed_experts import route_shape
    from spade_async.trainer.routing import Replay

    shape = route_shape(model.config)
    cap = RouteCapture(model)
    with torch.no_grad():
        model(ids)
    routes = cap.take().cpu().numpy().astype(shape.dtype).tobytes()
    replay = Replay(shape, replay=True, device=torch.device(device))
    replay.attach(model)
    T = ids.shape[1]
    mb = SimpleNamespace(seq_T=torch.zeros(T, dtype=torch.long), position_ids=torch.arange(T))
    times: dict[str, list[float]] = {"replay": [], "none": []}
    for i in range(2 * reps + 2):
        mode = "replay" if i % 2 == 0 else "none"
        replay.prepare([SimpleNamespace(routed_experts=routes if mode == "replay" else b"",
                                        token_ids=range(T), loss_mask=[1] * T)])  # fmt: skip
        replay.set_microbatch(mb)
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        replay.clear()
        if i >= 2:  # the first pair warms up
            times[mode].append(time.perf_counter() - t0)
    on, off = statistics.median(times["replay"]), statistics.median(times["none"])
    return {"step_ms": round(on * 1e3, 2), "no_replay_step_ms": round(off * 1e3, 2),
            "ratio": round(on / off, 3),
            "route_mismatch": float(replay.mismatch) / max(1.0, float(replay.total))}  # fmt: skip
