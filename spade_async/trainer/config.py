"""TrainerConfig: everything a trainer rank needs, one frozen struct (``[trainer]`` in a recipe)."""

from __future__ import annotations

from typing import Literal

import msgspec

from spade_async.config import Doc

__all__ = ["TrainerConfig", "LoraConfig", "LORA_TARGETS"]

# peft's names for the per-block linears of the families the trainer runs (Llama/Qwen)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    rank: Doc(int, "adapter rank r (A is r x in, B is out x r)") = 16
    alpha: Doc(float, "LoRA scaling numerator: the update is (alpha / rank) * B @ A") = 32.0
    dropout: Doc(float, "dropout on the adapter's input (peft lora_dropout)") = 0.0
    target_modules: Doc(
        tuple[str, ...], "per-block linears that get adapters (peft names, e.g. q_proj, down_proj)"
    ) = LORA_TARGETS


class TrainerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: Doc(str, "model name (embedded) or local Hugging Face directory to train") = (
        "smollm2-135m-instruct"
    )
    seed: Doc(int, "seed for torch RNGs on every rank (offset by rank)") = 0
    lr: Doc(float, "peak AdamW learning rate") = 1e-6
    betas: Doc(tuple[float, float], "AdamW betas") = (0.9, 0.999)
    weight_decay: Doc(float, "AdamW decoupled weight decay") = 0.0
    eps: Doc(float, "AdamW epsilon") = 1e-8
    warmup_steps: Doc(int, "linear learning-rate warm-up steps (from 0 to lr)") = 0
    total_steps: Doc(int, "steps of the cosine decay after warm-up; 0 keeps lr constant") = 0
    min_lr_ratio: Doc(float, "cosine floor as a fraction of lr") = 0.1
    grad_clip: Doc(float, "clip the global gradient norm to this value; 0 disables") = 1.0
    temperature: Doc(float, "sampling temperature the rollouts used (log_softmax(logits/T))") = 1.0
    micro_batch_tokens: Doc(int, "token budget of one packed micro-batch per rank") = 8192
    packing: Doc(bool, "pack sequences into rows (False pads every sample to the longest)") = True
    clip_low: Doc(float, "PPO lower clip range (ratio >= 1 - clip_low)") = 0.2
    clip_high: Doc(float, "PPO upper clip range (ratio <= 1 + clip_high)") = 0.28
    loss_agg: Doc(
        Literal["token", "seq-mean-token-mean", "seq-mean-token-sum"],
        "token: mean over the batch's loss tokens (a sample that counts but trains nothing adds "
        "one, as slime's max(n, 1)); seq-mean-*: mean over samples of their mean/sum (an "
        "episode's turn samples are one sample, as slime's group_mask_sums)",
    ) = "token"
    old_logprobs: Doc(
        Literal["detached", "rollout"],
        "PPO 'old' policy: the trainer's own log-probs before the step (detached) or the engine's "
        "(rollout; the TIS weight then compares the trainer's own with the engine's, as slime's "
        "--use-rollout-logprobs --use-tis)",
    ) = "detached"
    tis_cap: Doc(
        float,
        "cap of the truncated importance weight exp(trainer's own log-prob - rollout), detached "
        "(slime's --tis-clip); 0 disables",
    ) = 2.0
    kl_coef: Doc(
        float,
        "low_var_kl penalty towards the kl_reference policy's log-probs: k3 clamped to [-10, 10], "
        "no gradient outside (slime's compute_approx_kl); 0 disables",
    ) = 0.0
    kl_reference: Doc(
        Literal["initial", "rollout"],
        "KL target: a frozen copy of the initial policy on the trainer ranks, sharded like the "
        "policy (the reference's --ref-load), or the engines' rollout log-probs (no extra memory)",
    ) = "initial"
    kl_reference_routes: Doc(
        Literal["free", "replay"],
        "MoE with routing_replay: how the initial-policy KL reference routes. 'free': its own "
        "router picks the experts, as slime's reference pass does (the KL compares the policy "
        "under the engine's routes with the reference as it routes itself; small, not 0, at "
        "step 0); 'replay': the engine's recorded routes too (the KL measures weight drift "
        "under fixed routes; 0 at step 0) (trainer/routing.py)",
    ) = "free"
    entropy_coef: Doc(float, "entropy bonus coefficient; 0 skips computing entropy") = 0.0
    head: Doc(
        Literal["fused", "recompute"],
        "policy head: fused = loss and gradient in one pass over the vocabulary (3 T x V x D "
        "products); recompute = log-probs, then the loss, logits recomputed in backward (4)",
    ) = "fused"
    activation_checkpointing: Doc(
        Literal["full", "selective", "none"] | bool,
        "recompute in backward: full = each decoder block; selective = GEMM and attention "
        "outputs kept, only norms/RoPE/activations recomputed; none; true/false = full/none",
    ) = "none"
    liger: Doc(
        Literal["auto"] | bool,
        "Liger-Kernel RMSNorm/RoPE/SwiGLU on the decoder: auto = on CUDA for Qwen3/Qwen3-MoE/"
        "Llama when liger-kernel imports; true demands it; false never",
    ) = "auto"
    offload: Doc(
        Literal["none", "optimizer"],
        "optimizer: FSDP2 CPUOffloadPolicy keeps the sharded fp32 weights, gradients and AdamW "
        "states in (pinned, on CUDA) host memory and steps AdamW on the CPU; the GPU holds "
        "only the unsharded compute copies of the blocks in flight",
    ) = "none"
    lora: Doc(
        LoraConfig | None,
        "train peft LoRA adapters on the frozen base, e.g. { rank = 16, alpha = 32 } "
        "(trainer/lora.py); unset = full fine-tuning",
    ) = None
    sequence_parallel: Doc(
        int,
        "Ulysses sequence-parallel group size: N ranks share each packed row of up to N x "
        "micro_batch_tokens tokens, attention all-to-all over heads (trainer/sequence_parallel.py)",
    ) = 1
    routing_replay: Doc(
        bool | Literal["measure"],
        "MoE rollout routing replay (R3): engines return each token's experts and the trainer's "
        "MoE layers take them, weighted by its own router (trainer/routing.py); 'measure': the "
        "routes come back and train/route_mismatch compares them, no replay; MoE models only",
    ) = False
    hsdp: Doc(
        bool, "hybrid sharding: shard within a node, replicate across nodes (a 2-D device mesh)"
    ) = False
    mixed_precision: Doc(bool, "bf16 params/compute with fp32 reduce (only on GPU)") = True
    attn_implementation: Doc(
        str,
        "attention: 'auto' = flash_attention_2 on GPU when FA2 imports, else torch's varlen "
        "FlashAttention ('spade_varlen'), else per-sequence SDPA ('spade_varlen_sdpa', CPU)",
    ) = "auto"
    socket_path: Doc(str, "Unix socket rank 0 serves the RPC on ('' = <run_dir>/trainer.sock)") = ""
    start_timeout_s: Doc(float, "seconds to wait for the trainer ranks to come up") = 300.0
    push_timeout_s: Doc(float, "seconds one weight push to an engine may take") = 300.0
