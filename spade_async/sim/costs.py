"""The simulator's cost model: what each piece of work costs in seconds, with its source.

Two layers. ``GPUS``/``MODELS``/``EFFICIENCY``/``LENGTHS`` are the inputs, every number
beside its source (a datasheet, this repo's measurements in ``bench/results/``, or an
assumption said to be one); a cost file (TOML, ``--costs``) adds or overrides GPUs
(``[gpu.NAME]``) and models (``[model.NAME]``). ``Costs`` is what the simulated engines,
trainer and environments read: per-iteration and per-token seconds, already derived for one
placement (``gpu_costs``) or measured directly (``cpu_costs``, from ``bench/pipeline.py``'s
saved stage timings). A GPU or model the model does not know is an error naming the
parameters to supply: the simulator never guesses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from spade_async.errors import ConfigError

__all__ = ["Costs", "Lengths", "GPUS", "MODELS", "EFFICIENCY", "LENGTHS", "gpu_costs", "load_costs"]

GPU_KEYS = ("hbm_tb_s", "bf16_tflops", "memory_gib")
MODEL_KEYS = ("params", "active_params", "layers", "kv_heads", "head_dim")

# Datasheet figures (NVIDIA H100 SXM and H200 SXM product pages: HBM bandwidth, dense BF16
# tensor throughput without sparsity, memory).
GPUS: dict[str, dict] = {
    "h100-80gb": {"hbm_tb_s": 3.35, "bf16_tflops": 989.0, "memory_gib": 80.0,
                  "source": "NVIDIA H100 SXM datasheet"},
    "h200-141gb": {"hbm_tb_s": 4.8, "bf16_tflops": 989.0, "memory_gib": 141.0,
                   "source": "NVIDIA H200 SXM datasheet"},
}  # fmt: skip

MODELS: dict[str, dict] = {}  # filled from plan/shapes.py's built-in table (see model_costs)

EFFICIENCY: dict[str, tuple[float, str]] = {
    # measured: bench/results/gpu_check.json on a lent H200 (peak bf16 matmul 722.6 TFLOPS)
    "matmul": (722.64 / 989.0, "gpu_check.json parts.peak: 722.6 of 989 TFLOPS (H200)"),
    "train_mfu": (0.3027, "gpu_check.json parts.trainer.packed.mfu (H200, FSDP2, packed)"),
    "train_mfu_moe": (0.12, "assumed: FSDP2 without expert parallelism, ~0.4x the dense MFU"),
    "prefill_mfu": (0.45, "assumed: chunked prefill below the measured matmul peak"),
    "decode_hbm": (0.65, "assumed: decode reads weights + KV at 65% of datasheet HBM"),
    "decode_overhead_s": (
        0.0015,
        "assumed: CUDA-graph replay per iteration; SGLang's overlap scheduler hides its CPU side",
    ),
    "push_gb_s": (38.8, "gpu_check.json parts.export: trainer -> engine 38.8 GB/s (H200)"),
    "push_fixed_s": (0.3, "assumed: pause, flush and resume around the update"),
    "env_step_s": (0.0008, "bench/results/env_pool.json pooled_step p90 (0.08 ms median)"),
    "env_open_s": (0.0126, "bench/results/env_pool.json open_prewarmed_worker median"),
    "validate_s": (0.026, "bench/results/env_check.json in_pool median (validation gates)"),
}


@dataclass(frozen=True)
class Lengths:
    """Token counts and turn counts: long-tailed draws (lognormal, capped), per role."""

    agent_reply_median: float = 300.0
    agent_reply_sigma: float = 1.0
    agent_turns_median: float = 4.0
    agent_turns_sigma: float = 0.8
    prompt_tokens: int = 600
    obs_tokens: int = 120
    hint_reply_median: float = 250.0
    hint_reply_sigma: float = 0.6
    designer_reply_median: float = 4000.0
    designer_reply_sigma: float = 0.5
    designer_prompt_tokens: int = 9000  # a 6,000-word document + contract + memory examples
    valid_p: float = (
        0.92  # the SPADE paper (docs/method.md): ~92% of designer generations valid (30B)
    )
    win_p: float = 0.4
    source: str = (
        "assumed lognormals (no per-turn length data in the reference's reports), set to the "
        "8B recipe's own estimate: ~4k-token episodes, ~2M decoded tokens per step "
        "(configs/qwen3-8b-games.toml); sigma 1.0 gives a p99/median of ~10x per reply; "
        "designer validity 0.92 from the SPADE paper"
    )


LENGTHS = Lengths()


@dataclass(frozen=True)
class Costs:
    """Seconds per unit of work, for one placement (what the simulated parts read)."""

    name: str
    engines: int  # engine servers
    iter_fixed_s: float  # one decode iteration: fixed part
    iter_per_seq_s: float  # + per running sequence
    iter_per_ctx_s: float  # + per token of context held by the running sequences
    prefill_per_token_s: float
    kv_capacity_tokens: int  # per engine: tokens the KV cache holds (admission)
    train_fixed_s: float  # one trainer step: fixed part (optimizer, gradient sync)
    train_per_token_s: float
    train_per_ctx_token_s: float  # attention: per token x its sequence's length
    push_s: float  # one weight push (engines paused around it)
    env_step_s: float
    env_open_s: float
    validate_s: float
    colocated: bool = False  # engines and trainer share the GPUs (take turns)
    checkpoint_s: float = 0.0  # one checkpoint write (sim/extras.py)
    offload_s: float = 0.0  # added to every train step with the optimizer offloaded
    lengths: Lengths = LENGTHS
    notes: dict = field(default_factory=dict)

    def with_lengths(self, **kw) -> Costs:
        return replace(self, lengths=replace(self.lengths, **kw))


def load_costs(path: str | Path | None) -> tuple[dict, dict]:
    """GPU and model tables: the built-ins, plus a cost file's ``[gpu.X]``/``[model.X]``."""
    gpus, models = {k: dict(v) for k, v in GPUS.items()}, {k: dict(v) for k, v in MODELS.items()}
    if path:
        from spade_async.sim.cost_checks import read_costs

        raw = read_costs(path)  # every value in its range, or one line (cost_checks.py)
        for k, v in raw.get("gpu", {}).items():
            gpus[k.lower()] = {**gpus.get(k.lower(), {}), **v, "source": f"{path}"}
        for k, v in raw.get("model", {}).items():
            models[k.lower()] = {**models.get(k.lower(), {}), **v, "source": f"{path}"}
    return gpus, models


def model_costs(model: str, models: dict) -> dict:
    """A model's cost inputs: the cost file's ``[model.NAME]``, else plan/shapes.py's table."""
    from spade_async.plan.shapes import model_shape

    name = Path(model).name.lower()
    if name in models:
        m = models[name]
    else:
        shape = model_shape(model)
        if shape is None:
            raise ConfigError(
                f"cost model: no model '{name}': supply [model.{name}] "
                f"{', '.join(MODEL_KEYS)} in a --costs file"
            )
        active = shape.params
        if shape.experts:
            per_layer = 3 * shape.hidden * shape.moe_intermediate
            active -= shape.layers * per_layer * (shape.experts - shape.experts_per_tok)
        m = {
            "params": shape.params,
            "active_params": active,
            "layers": shape.layers,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "moe": bool(shape.experts),
            "source": f"plan/shapes.py ({shape.source})",
        }
    missing = [k for k in MODEL_KEYS if k not in m]
    if missing:
        raise ConfigError(
            f"cost model: model '{name}' lacks {', '.join(missing)}: supply them in [model.{name}]"
        )
    return m


def gpu_entry(gpu: str, gpus: dict) -> dict:
    g = gpus.get(gpu.lower())
    missing = list(GPU_KEYS) if g is None else [k for k in GPU_KEYS if k not in g]
    if missing:
        raise ConfigError(
            f"cost model: no GPU '{gpu}'"
            + ("" if g is None else f" {', '.join(missing)}")
            + f": supply [gpu.{gpu}] {', '.join(missing)} in a --costs file "
            f"(known: {', '.join(sorted(gpus))})"
        )
    return g


def gpu_costs(
    model: str,
    gpu: str,
    *,
    engine_gpus: int,
    tp: int,
    trainer_gpus: int,
    colocated: bool = False,
    mem_fraction: float = 0.85,
    kl_reference: bool = True,
    checkpointing: bool = True,
    costs_file: str | Path | None = None,
    push_bytes: int = 0,
    offload: bool = False,
) -> Costs:
    """Roofline costs for ``engine_gpus`` GPUs of engines (``tp`` each) and ``trainer_gpus``
    of FSDP trainer (colocated: the same GPUs, taking turns). The push runs at the rate
    measured for a CUDA-IPC push (an NCCL broadcast over NVLink is taken to be as fast);
    ``push_bytes`` (``plan.memory``'s) replaces the full weights (LoRA: the adapters). A
    checkpoint write and, with ``offload``, the optimizer's host round trip per train step
    come from ``sim/extras.py`` (their sources in ``notes``)."""
    from spade_async.sim import extras

    gpus, models = load_costs(costs_file)
    g, m = gpu_entry(gpu, gpus), model_costs(model, models)
    eff = {k: v for k, (v, _) in EFFICIENCY.items()}
    bw = g["hbm_tb_s"] * 1e12 * eff["decode_hbm"] * tp  # bytes/s of one engine (tp GPUs)
    flops = g["bf16_tflops"] * 1e12 * tp
    weight_bytes = 2 * m["params"]
    kv_token = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * 2
    kv_cap = int((g["memory_gib"] * 2**30 * tp * mem_fraction - weight_bytes) / kv_token)
    if kv_cap <= 0:
        raise ConfigError(
            f"cost model: {Path(model).name} ({weight_bytes / 1e9:.0f} GB) leaves no KV cache on "
            f"{tp} x {gpu}: raise engine TP"
        )
    # a decode iteration streams every weight a token touches (MoE: experts hit by the batch;
    # bounded by all of them) and the running sequences' KV; the GEMMs are per token
    moe_read = 2 * m["params"] if m.get("moe") else weight_bytes
    fwd_flops = 2 * m["active_params"]
    passes = 3 + (1 if checkpointing else 0) + (1 if kl_reference else 0)  # fwd + bwd(2) ...
    mfu = eff["train_mfu_moe"] if m.get("moe") else eff["train_mfu"]
    train_flops = trainer_gpus * g["bf16_tflops"] * 1e12 * mfu
    attn = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * 8  # q heads ~ 4-8x kv heads
    n_eng = max(1, engine_gpus // tp)
    return Costs(
        name=f"{Path(model).name} on {gpu}: {engine_gpus} engine + {trainer_gpus} trainer GPUs"
        + (" (colocated)" if colocated else ""),
        engines=n_eng,
        iter_fixed_s=eff["decode_overhead_s"] + moe_read / bw,
        iter_per_seq_s=fwd_flops / (flops * eff["matmul"]),
        iter_per_ctx_s=kv_token / bw,
        prefill_per_token_s=fwd_flops / (flops * eff["prefill_mfu"]),
        kv_capacity_tokens=kv_cap,
        train_fixed_s=1.0,
        train_per_token_s=passes * fwd_flops / train_flops,
        train_per_ctx_token_s=passes * attn / train_flops,
        # the full bf16 weights, or what plan.memory says a push sends (LoRA: the adapters)
        push_s=eff["push_fixed_s"] + (push_bytes or weight_bytes) / (eff["push_gb_s"] * 1e9),
        env_step_s=eff["env_step_s"],
        env_open_s=eff["env_open_s"],
        validate_s=eff["validate_s"],
        colocated=colocated,
        checkpoint_s=extras.checkpoint_s(m["params"]),
        offload_s=extras.offload_s(m["params"], trainer_gpus) if offload else 0.0,
        notes={"gpu": g.get("source", ""), "model": m.get("source", ""),
               "kv_capacity_tokens_per_engine": kv_cap, "weights_gb": weight_bytes / 1e9,
               "checkpoint": extras.SOURCES["checkpoint"],
               "evaluation": extras.SOURCES["evaluation"],
               **({"offload": extras.SOURCES["offload"]} if offload else {})},
    )  # fmt: skip


def lognormal(rng, median: float, sigma: float, cap: float) -> tuple[int, bool]:
    """One draw, rounded up, and whether it hit ``cap``."""
    x = median * math.exp(sigma * rng.standard_normal())
    return (int(cap), True) if x >= cap else (max(1, math.ceil(x)), False)
