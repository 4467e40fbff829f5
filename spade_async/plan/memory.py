"""Per-GPU memory of a recipe, and whether it fits: the arithmetic ``--dry-run`` prints.

Legend: P parameters, R trainer ranks (FSDP2 shards over all of them), B one decoder block's
parameters, Q the root group's (embedding, final norm, untied lm_head), c bytes of the
compute dtype (2: bf16 with mixed precision on GPU, else 4), T tokens of the longest packed
row, N ``trainer.sequence_parallel``, t = ceil(T / N) tokens per rank, L layers, D hidden,
q = heads x head_dim, kv = kv_heads x head_dim, I the MLP width (dense), E experts, k experts
per token, Im the expert width, V vocabulary.

Trainer GPU, full fine-tuning, ``trainer.offload = "none"`` (model.py / step.py as run):

- params: 4P/R fp32 shard + c(Q + 2B) unsharded compute copies (the root stays gathered for
  the whole forward/backward, one block runs while the next is prefetched);
- grads: 4P/R fp32 shard + (c + 4) max(B, Q) for the unsharded gradients of the group being
  reduce-scattered (computed in c, reduced in fp32; just 4 max(B, Q) when c = 4);
- optimizer: 8P/R (AdamW's two fp32 moments);
- offload "optimizer" (FSDP2 ``CPUOffloadPolicy``): the three 4P/R, 4P/R, 8P/R shards move to
  pinned host memory (16P/R per rank); the GPU keeps the compute copies and the unsharded
  gradients, plus one group's fp32 shard in flight each way (4 max(B, Q)/R twice);
- LoRA (trainer/lora.py): the frozen base keeps its fp32 shard (4P/R, no gradient, no
  moments; on the host with offload) and its compute copies; the adapters (P_a parameters)
  cost 16 P_a/R like full fine-tuning plus c P_a unsharded gradients; no unsharded base
  gradients;
- KL reference (kl_coef > 0, kl_reference = "initial"): a frozen sharded copy (4P/R, on the
  host with offload) + its own c(Q + 2B) compute copies during its forward; with LoRA none
  (the base with the adapters disabled is the initial policy);
- activations at t tokens per rank, per token per layer, in elements of c bytes:
  attention e_a = 2D + (q + 2kv) + (q + kv) [roped q, k] + (q + kv if q/k-norm) + q, plus
  4 bytes x heads (the softmax log-sum-exp); MLP dense e_m = 2D + 4I, MoE e_m = 2D + k(D +
  4 Im) plus 4 bytes x E (fp32 router logits); LoRA adds r per target (+ its input width when
  dropout > 0). With activation checkpointing the blocks keep only their input, L t D c,
  plus one block's full set during its recompute, t (c(e_a + e_m) + fp32 terms); without,
  L t (c(e_a + e_m) + fp32 terms). Sequence parallel adds its all-to-all buffers,
  c t (2q + 2kv). The embedding output, final hidden and its gradient, 3 t D c, and the fused
  head's two chunk buffers (logits and their gradient), 2 x 96 Mi x c (kernels' default
  chunk on GPU) come on top;
- reserve: 2 GiB (CUDA context, NCCL communicators) + 5% of the GPU (allocator fragmentation).

Engines: SGLang takes ``engine.mem_fraction_static`` of each GPU for weights (2P/TP, bf16)
and KV cache (2 L kv 2 bytes per token / TP when TP divides the KV heads, else replicated);
what is left is the KV pool. Colocated, the engines' share of a trainer GPU while it trains
is 2 GiB with ``placement.release_memory`` (SGLang's memory saver frees weights and KV; the
CUDA graphs and context stay), else mem_fraction_static of the GPU.

The planner says fits / does not fit for the trainer GPUs and the engine GPUs, and when a
trainer GPU does not fit, re-plans with each single knob changed (offload, activation
checkpointing, sequence parallel, LoRA) and names the first that fits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from spade_async.plan.gpus import Gpu
from spade_async.plan.shapes import ModelShape

if TYPE_CHECKING:
    from spade_async.recipe import Config

__all__ = [
    "GIB",
    "MemoryPlan",
    "TrainerGpu",
    "EngineGpu",
    "plan_memory",
    "format_plan",
    "longest_sample",
    "lora_params",
    "trainer_gpu",
    "HEAD_CHUNK_ELEMS",
    "RESERVE_BYTES",
    "RESERVE_FRACTION",
]

GIB = 1 << 30
HEAD_CHUNK_ELEMS = 96 * (1 << 20)  # kernels/logprob.py: 24M logits elements per chunk, x4 on GPU
RESERVE_BYTES = 2 * GIB
RESERVE_FRACTION = 0.05
ENGINE_RELEASED_BYTES = 2 * GIB
DESIGNER_PROMPT_BASE = 2048  # instructions + memory examples, tokens
TOKENS_PER_WORD = 1.4  # corpus documents (English prose, BPE)


class TrainerGpu(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes on one trainer GPU (and its host share)."""

    params: int
    grads: int
    optimizer: int
    reference: int
    activations: int
    engine_share: int
    reserve: int
    capacity: int
    host_pinned: int  # per rank, with offload
    tokens: int  # the packed row planned (whole row, before sequence parallel)

    @property
    def total(self) -> int:
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.reference
            + self.activations
            + self.engine_share
            + self.reserve
        )

    @property
    def trainer(self) -> int:
        """What the trainer itself allocates (no engine share, no reserve)."""
        return self.params + self.grads + self.optimizer + self.reference + self.activations

    @property
    def margin(self) -> int:
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        return self.margin >= 0


class EngineGpu(msgspec.Struct, frozen=True, kw_only=True):
    tp: int
    weights: int
    static: int  # mem_fraction_static x capacity
    kv_bytes_per_token: int  # on one GPU of the group
    capacity: int

    @property
    def kv_pool(self) -> int:
        return self.static - self.weights

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_pool) // max(1, self.kv_bytes_per_token)


class MemoryPlan(msgspec.Struct, frozen=True, kw_only=True):
    gpu: Gpu
    shape: ModelShape
    ranks: int
    trainer: TrainerGpu
    engines: list[EngineGpu]
    knob: str  # the single change that makes a non-fitting trainer GPU fit ('' if fits/none)
    push_bytes: int  # one weight push (bf16): the full model, or only the adapters with LoRA
    full_push_bytes: int
    sample_tokens: int
    sample_estimated: bool
    on_gpu: bool


def longest_sample(cfg: Config) -> tuple[int, bool]:
    """(tokens, estimated): the longest sample the recipe can produce. An agent episode is
    bounded by agent.max_episode_tokens; a designer sample by its reply limit plus its
    prompt, estimated as DESIGNER_PROMPT_BASE + TOKENS_PER_WORD x corpus.max_words."""
    agent = cfg.agent.max_episode_tokens
    if not (cfg.designer_enabled and cfg.designer_train):
        return agent, False
    prompt = DESIGNER_PROMPT_BASE
    if cfg.designer.use_corpus:
        prompt += math.ceil(TOKENS_PER_WORD * cfg.corpus.max_words)
    designer = cfg.designer.max_new_tokens + prompt
    return max(agent, designer), designer > agent


def lora_params(shape: ModelShape, rank: int, targets: list[str]) -> int:
    """Adapter parameters: r (in + out) per targeted linear per block."""
    lin = shape.linear_shapes()
    return shape.layers * sum(rank * (lin[m][0] + lin[m][1]) for m in targets if m in lin)


def _activations(shape: ModelShape, t: int, c: int, *, ckpt: str | bool, sp: int, lora) -> int:
    """Bytes of saved activations for ``t`` tokens. ``ckpt``: full (each block's input kept,
    one block's activations live during its recompute), selective (the GEMM and attention
    outputs kept per block, norms/RoPE/activation functions recomputed; trainer/
    checkpointing.py), none (everything kept); true/false = full/none."""
    from spade_async.trainer.checkpointing import mode_of

    mode = mode_of(ckpt)
    D, L = shape.hidden, shape.layers
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    e_a = 2 * D + (q + 2 * kv) + (q + kv) + ((q + kv) if shape.qk_norm else 0) + q
    fp32 = 4 * shape.heads
    if shape.experts:
        e_m = 2 * D + shape.experts_per_tok * (D + 4 * shape.moe_intermediate)
        fp32 += 4 * shape.experts
        gemm_m = shape.experts_per_tok * (2 * shape.moe_intermediate + D)
    else:
        e_m = 2 * D + 4 * shape.intermediate
        gemm_m = 2 * shape.intermediate + D  # gate and up outputs, down's output
    extra_lora = 0
    if lora is not None:
        lin = shape.linear_shapes()
        for m in lora.target_modules:
            if m in lin:
                extra_lora += lora.rank + (lin[m][0] if lora.dropout > 0 else 0)
    e_m += extra_lora
    per_block = t * (c * (e_a + e_m) + fp32)
    if mode == "full":
        blocks = L * t * D * c + per_block
    elif mode == "selective":
        # kept: the block input, the q/k/v projections, the attention output, o_proj's
        # output, the MLP GEMM outputs (and the LoRA intermediates), the softmax statistics
        kept = t * (c * (D + (q + 2 * kv) + q + D + gemm_m + extra_lora) + fp32)
        blocks = L * kept + (per_block - kept)  # one block's recomputed rest is live at once
    else:
        blocks = L * per_block
    extra = c * t * (2 * q + 2 * kv) if sp > 1 else 0
    return blocks + extra + 3 * t * D * c + 2 * HEAD_CHUNK_ELEMS * c


def trainer_gpu(
    shape: ModelShape,
    *,
    ranks: int,
    capacity: int,
    tokens: int,
    on_gpu: bool = True,
    mixed_precision: bool = True,
    offload: str = "none",
    lora=None,
    sequence_parallel: int = 1,
    activation_checkpointing: str | bool = True,
    kl_reference: bool = False,
    engine_share: int = 0,
) -> TrainerGpu:
    """One trainer GPU's bytes (the module docstring's formulas)."""
    P, B, Q, R = shape.params, shape.block_params, shape.root_params, max(1, ranks)
    c = 2 if mixed_precision and on_gpu else 4
    big = max(B, Q)
    work = c * (Q + 2 * B)
    unsharded_grads = (c + 4 if c != 4 else 4) * big
    off = offload == "optimizer"
    host = 0
    if lora is not None:
        Pa = lora_params(shape, lora.rank, lora.target_modules)
        params = 4 * P // R + work + 4 * Pa // R
        grads = 4 * Pa // R + c * Pa  # sharded fp32 + the adapters' unsharded grads (tiny)
        optimizer = 8 * Pa // R
        if off:
            host = 4 * P // R + 16 * Pa // R
            params, grads, optimizer = work, c * Pa, 0
    elif off:
        params = work + 4 * big // R
        grads = unsharded_grads + 4 * big // R
        optimizer = 0
        host = 16 * P // R
    else:
        params = 4 * P // R + work
        grads = 4 * P // R + unsharded_grads
        optimizer = 8 * P // R
    reference = 0
    if kl_reference and lora is None:  # LoRA: the base with adapters off is the reference
        reference = work + (0 if off else 4 * P // R)
        host += 4 * P // R if off else 0
    sp = max(1, sequence_parallel)
    t = math.ceil(tokens / sp)
    acts = _activations(shape, t, c, ckpt=activation_checkpointing, sp=sp, lora=lora)
    return TrainerGpu(
        params=params,
        grads=grads,
        optimizer=optimizer,
        reference=reference,
        activations=acts,
        engine_share=engine_share,
        reserve=RESERVE_BYTES + int(RESERVE_FRACTION * capacity),
        capacity=capacity,
        host_pinned=host,
        tokens=tokens,
    )


def _engine_gpus(cfg: Config, shape: ModelShape, gpu: Gpu) -> list[EngineGpu]:
    out = []
    for group in cfg.engine.gpus if cfg.engine.kind == "sglang" else []:
        tp = max(1, len(group))
        # TP shards the KV heads; past their count each rank keeps one (replicated)
        kv_local = shape.kv_heads // tp if shape.kv_heads % tp == 0 else 1
        per_token = 2 * shape.layers * kv_local * shape.head_dim * 2
        out.append(
            EngineGpu(
                tp=tp,
                weights=2 * shape.params // tp,
                static=int(cfg.engine.mem_fraction_static * gpu.memory_bytes),
                kv_bytes_per_token=per_token,
                capacity=gpu.memory_bytes,
            )
        )
    return out


def _trainer_for(cfg: Config, shape: ModelShape, gpu: Gpu, tokens: int, **change) -> TrainerGpu:
    tc, pl = cfg.trainer, cfg.placement
    on_gpu = bool(pl.trainer_gpus)
    ranks = (len(pl.trainer_gpus) or pl.cpu_ranks) * max(1, pl.nnodes)
    share = 0
    if pl.colocate:
        share = (
            ENGINE_RELEASED_BYTES
            if pl.release_memory
            else int(cfg.engine.mem_fraction_static * gpu.memory_bytes)
        )
    kw = dict(
        ranks=ranks,
        capacity=gpu.memory_bytes,
        tokens=tokens,
        on_gpu=on_gpu,
        mixed_precision=tc.mixed_precision,
        offload=tc.offload,
        lora=tc.lora,
        sequence_parallel=tc.sequence_parallel,
        activation_checkpointing=tc.activation_checkpointing,
        kl_reference=tc.kl_coef > 0 and tc.kl_reference == "initial",
        engine_share=share,
    )
    kw.update(change)
    return trainer_gpu(shape, **kw)


def _knob(cfg: Config, shape: ModelShape, gpu: Gpu, tokens: int) -> str:
    """The first single change (in this order) under which the trainer GPU fits."""
    from spade_async.trainer.checkpointing import mode_of
    from spade_async.trainer.config import LoraConfig

    tc = cfg.trainer
    tries: list[tuple[str, dict]] = []
    if tc.offload == "none":
        tries.append(('trainer.offload = "optimizer"', {"offload": "optimizer"}))
    mode = mode_of(tc.activation_checkpointing)
    if mode == "none":
        tries.append(
            (
                'trainer.activation_checkpointing = "selective"',
                {"activation_checkpointing": "selective"},
            )
        )
    if mode != "full":
        tries.append(
            ('trainer.activation_checkpointing = "full"', {"activation_checkpointing": "full"})
        )
    ranks = (len(cfg.placement.trainer_gpus) or cfg.placement.cpu_ranks) * cfg.placement.nnodes
    for n in (2, 4, 8):
        if n > tc.sequence_parallel and shape.heads % n == 0 and ranks % n == 0:
            tries.append((f"trainer.sequence_parallel = {n}", {"sequence_parallel": n}))
    if tc.lora is None:
        tries.append(("trainer.lora = { rank = 16 }", {"lora": LoraConfig(rank=16)}))
    if tc.offload == "none":  # two knobs together, last
        for n in (2, 4, 8):
            if shape.heads % n == 0 and ranks % n == 0:
                tries.append(
                    (
                        f'trainer.offload = "optimizer" with trainer.sequence_parallel = {n}',
                        {"offload": "optimizer", "sequence_parallel": n},
                    )
                )
    for words, change in tries:
        if _trainer_for(cfg, shape, gpu, tokens, **change).fits:
            return words
    return ""


def plan_memory(cfg: Config, shape: ModelShape, gpu: Gpu, *, sample_tokens: int = 0) -> MemoryPlan:
    """The recipe's per-GPU memory on ``gpu``; ``sample_tokens`` overrides the longest sample."""
    longest, estimated = longest_sample(cfg)
    if sample_tokens:
        longest, estimated = sample_tokens, False
    # a row packs micro_batch_tokens per rank (x sequence_parallel ranks); a longer sample
    # packs alone
    tokens = max(longest, cfg.trainer.micro_batch_tokens * max(1, cfg.trainer.sequence_parallel))
    trainer = _trainer_for(cfg, shape, gpu, tokens)
    full_push = 2 * shape.params
    push = full_push
    if cfg.trainer.lora is not None:
        push = 2 * lora_params(shape, cfg.trainer.lora.rank, cfg.trainer.lora.target_modules)
    pl = cfg.placement
    return MemoryPlan(
        gpu=gpu,
        shape=shape,
        ranks=(len(pl.trainer_gpus) or pl.cpu_ranks) * max(1, pl.nnodes),
        trainer=trainer,
        engines=_engine_gpus(cfg, shape, gpu),
        knob="" if trainer.fits else _knob(cfg, shape, gpu, tokens),
        push_bytes=push,
        full_push_bytes=full_push,
        sample_tokens=longest,
        sample_estimated=estimated,
        on_gpu=bool(pl.trainer_gpus),
    )


def _g(n: int) -> str:
    return f"{n / GIB:.1f}"


def format_plan(plan: MemoryPlan, cfg: Config) -> list[str]:
    """The dry run's memory lines."""
    tr, s, tc = plan.trainer, plan.shape, cfg.trainer
    gpu = plan.gpu
    where = {"named": "named by --gpu", "nvidia-smi": "found by nvidia-smi"}.get(
        gpu.source, "assumed: no GPU here and none named (--gpu)"
    )
    from spade_async.trainer.checkpointing import mode_of

    ckpt = mode_of(tc.activation_checkpointing)
    how = f"offload {tc.offload}"
    if tc.lora is not None:
        how += f", LoRA rank {tc.lora.rank} on {','.join(tc.lora.target_modules)}"
    if tc.sequence_parallel > 1:
        how += f", sequence parallel {tc.sequence_parallel}"
    est = " (estimated designer prompt + reply)" if plan.sample_estimated else ""
    lines = [
        f"memory plan on {gpu.name} ({_g(gpu.memory_bytes)} GiB, {where}): {s.name} "
        f"({s.params / 1e9:.2f}B params, shape from {s.source}), {plan.ranks} trainer rank(s), "
        f"{how}, activation checkpointing {ckpt}",
        f"  longest sample {plan.sample_tokens} tokens{est}; packed row planned: {tr.tokens} "
        f"tokens ({math.ceil(tr.tokens / max(1, tc.sequence_parallel))} per rank)",
        f"  trainer GPU: params {_g(tr.params)} + grads {_g(tr.grads)} + optimizer "
        f"{_g(tr.optimizer)} + KL reference {_g(tr.reference)} + activations "
        f"{_g(tr.activations)} + engines' share {_g(tr.engine_share)} + reserve "
        f"{_g(tr.reserve)} = {_g(tr.total)} GiB of {_g(tr.capacity)}",
    ]
    if tr.host_pinned:
        lines.append(
            f"  host memory (offload): {_g(tr.host_pinned)} GiB pinned per rank, "
            f"{_g(tr.host_pinned * plan.ranks)} GiB over the {plan.ranks} ranks"
        )
    if tr.fits:
        lines.append(f"  trainer GPU fits: margin {_g(tr.margin)} GiB")
    else:
        fix = f"set {plan.knob}" if plan.knob else "no single knob fits: add trainer GPUs"
        lines.append(f"  trainer GPU does NOT fit: {_g(-tr.margin)} GiB over; {fix}")
    for i, e in enumerate(plan.engines):
        ok = e.kv_pool > 0 and e.kv_tokens >= plan.sample_tokens
        verdict = (
            "fits"
            if ok
            else "does NOT fit: raise engine.mem_fraction_static or the TP size (engine.gpus)"
        )
        lines.append(
            f"  engine {i} (TP {e.tp}) per GPU: weights {_g(e.weights)} GiB, KV pool "
            f"{_g(max(0, e.kv_pool))} GiB = {e.kv_tokens:,} tokens (mem_fraction_static "
            f"{cfg.engine.mem_fraction_static}); {verdict}"
        )
    ratio = plan.push_bytes / plan.full_push_bytes
    if tc.lora is None:
        lines.append(f"  weight push: {plan.full_push_bytes / 1e6:,.1f} MB bf16 (full model)")
    else:
        lines.append(
            f"  weight push: the run loop sends the merged model, {plan.full_push_bytes / 1e6:,.1f}"
            f" MB bf16; an adapter-only push (PushWeights mode 'lora') is "
            f"{plan.push_bytes / 1e6:,.1f} MB ({100 * ratio:.2f}% of it)"
        )
    if tc.routing_replay and s.experts:
        from spade_async.generation.routed_experts import RouteShape
        from spade_async.plan.routes import routes_line

        routes = RouteShape(layers=s.layers, topk=s.experts_per_tok, experts=s.experts)
        lines.append(routes_line(routes, tr.tokens, plan.sample_tokens, cfg.batch_samples))
    return lines


def plan_lines(
    cfg: Config, model_dir: str | Path, gpu: Gpu, *, sample_tokens: int = 0
) -> list[str]:
    from spade_async.plan.shapes import model_shape

    shape = model_shape(model_dir)
    if shape is None:
        return [
            f"memory plan: unknown shape for '{model_dir}' (no readable config.json of a "
            "Llama/Qwen family and not a built-in model)"
        ]
    return format_plan(plan_memory(cfg, shape, gpu, sample_tokens=sample_tokens), cfg)
