"""Policy model: a Hugging Face causal LM behind a log-prob head, sharded with FSDP2.

Legend: T tokens of a micro-batch, D hidden size, V vocabulary size, K loss tokens (the
positions the vocabulary projection is restricted to).

``PolicyModel.forward`` runs the decoder (``causal_lm.model``) to hidden states and then
either the one-pass ``policy_head`` (given ``terms``: the loss and its gradient w.r.t. the
head in one pass over the vocabulary, ``trainer.head = "fused"``) or the chunked
``linear_logprob`` (log-probs only; the reference pass, and ``trainer.head = "recompute"``)
against the lm_head weight, so [T, V] logits are never built.
FSDP2 (``fully_shard``) wraps each decoder block and then this module as the root: the
embedding, final norm and (possibly tied) lm_head live in the root group and are unsharded
for the whole forward, which is where the log-prob head reads the lm_head weight.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from spade_kernels import HeadOut, PolicyTerms, linear_logprob, policy_head
from torch import nn

from spade_async.errors import ConfigError
from spade_async.trainer import attention, checkpointing
from spade_async.trainer.config import TrainerConfig

__all__ = [
    "PolicyModel",
    "load_policy",
    "decoder_layers",
    "check_attention",
    "flash_attn_2_available",
]

log = logging.getLogger(__name__)


class PolicyModel(nn.Module):
    def __init__(self, causal_lm: nn.Module, temperature: float) -> None:
        super().__init__()
        self.causal_lm = causal_lm
        self.temperature = temperature
        impl = getattr(causal_lm.config, "_attn_implementation", "")
        # causal-only kernels: padded rows are right-padded, so no padding mask is needed
        self.attn_impl = impl
        self.varlen_attention = impl in (attention.NAME, attention.VARLEN, FA2, FA3)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        target_T: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        return_entropy: bool = False,
        index_K: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int = 0,
        terms: PolicyTerms | None = None,
    ):
        """Log-prob (and entropy) of ``target_T`` at every position, [T] fp32 (fp64 for an fp64 model).

        ``index_K`` restricts the vocab projection to K positions (the loss tokens): the
        others come back as 0 without ever touching the [*, V] head, which is most of the
        cost when observations and prompts dominate an episode. With ``terms`` (per-token
        loss inputs over all T positions) the one-pass head runs instead and this returns
        ``HeadOut(loss, logprob_T, entropy_T)`` (log-probs/entropy detached, [T]).
        """
        varlen = {}
        if cu_seqlens is not None:  # packed row: varlen attention (flash-attn or ours)
            varlen = dict(
                cu_seq_lens_q=cu_seqlens,
                cu_seq_lens_k=cu_seqlens,
                max_length_q=max_seqlen,
                max_length_k=max_seqlen,
            )
            if self.attn_impl == attention.NAME:  # per-sequence SDPA: bounds once, not per layer
                varlen[attention.BOUNDS_KEY] = tuple(cu_seqlens.tolist())
        out = self.causal_lm.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=None if self.varlen_attention else attention_mask,
            use_cache=False,
            **varlen,
        )
        hidden_TD = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        weight_VD = self.causal_lm.get_output_embeddings().weight
        if terms is not None:
            return self._head(hidden_TD, weight_VD, target_T, terms, index_K, return_entropy)
        if index_K is None:
            out = linear_logprob(
                hidden_TD,
                weight_VD,
                target_T,
                temperature=self.temperature,
                return_entropy=return_entropy,
            )
            # FSDP's pre-backward hook must not sit on a view: return fresh [T] tensors.
            return tuple(t.clone() for t in out) if return_entropy else out.clone()
        out = linear_logprob(
            hidden_TD[index_K],
            weight_VD,
            target_T[index_K],
            temperature=self.temperature,
            return_entropy=return_entropy,
        )
        acc = torch.promote_types(hidden_TD.dtype, torch.float32)  # fp64 stays fp64 (references)
        zeros_T = hidden_TD.new_zeros(target_T.shape[0], dtype=acc)
        scatter = [
            zeros_T.index_put((index_K,), t.to(acc)) for t in (out if return_entropy else (out,))
        ]
        return tuple(scatter) if return_entropy else scatter[0]

    def _head(self, hidden_TD, weight_VD, target_T, terms, index_K, return_entropy) -> HeadOut:
        if index_K is not None:
            hidden_TD, target_T, terms_K = (
                hidden_TD[index_K],
                target_T[index_K],
                terms.index(index_K),
            )
        else:
            terms_K = terms
        out = policy_head(
            hidden_TD,
            weight_VD,
            target_T,
            terms_K,
            temperature=self.temperature,
            return_entropy=return_entropy,
        )
        if index_K is None:
            return out
        n = terms.token_weight_T.shape[0]
        lp_T = out.logprob_T.new_zeros(n).index_put_((index_K,), out.logprob_T)
        ent_T = None
        if out.entropy_T is not None:
            ent_T = out.entropy_T.new_zeros(n).index_put_((index_K,), out.entropy_T)
        return HeadOut(out.loss, lp_T, ent_T)


def decoder_layers(causal_lm: nn.Module) -> list[nn.Module]:
    layers = getattr(getattr(causal_lm, "model", None), "layers", None)
    if layers is None:
        raise TypeError(
            f"{type(causal_lm).__name__} has no .model.layers; the trainer supports decoder-only "
            "causal LMs laid out like Llama/Qwen/SmolLM"
        )
    return list(layers)


FA2 = "flash_attention_2"
FA3 = "flash_attention_3"
_logged: set[str] = set()


def flash_attn_2_available() -> bool:
    """FlashAttention-2 really imports here (transformers' own check: the ``flash-attn``
    distribution >= 2.3.3 and CUDA). A bare ``flash_attn/`` folder, as ``flash-attn-4``
    installs, is not FA2."""
    from transformers.utils import is_flash_attn_2_available

    return bool(is_flash_attn_2_available())


def flash_attn_3_available() -> bool:
    """FlashAttention-3 (the flash-attn package's Hopper kernels) imports here."""
    from transformers.utils import is_flash_attn_3_available

    return bool(is_flash_attn_3_available())


def check_attention(attn_implementation: str, on_gpu: bool) -> None:
    """A recipe that demands a GPU attention kernel where it cannot run fails with one line."""
    if attn_implementation == attention.VARLEN:
        if not on_gpu:
            raise ConfigError(
                f"trainer.attn_implementation = '{attention.VARLEN}' (torch's varlen "
                "FlashAttention) needs trainer GPUs (placement.trainer_gpus is empty): set "
                "trainer.attn_implementation = 'auto'"
            )
        if not attention.torch_varlen_available():
            raise ConfigError(
                f"trainer.attn_implementation = '{attention.VARLEN}' but this torch "
                f"({torch.__version__}) has no torch.nn.attention.varlen: set "
                "trainer.attn_implementation = 'auto'"
            )
        return
    if attn_implementation == FA3:
        if not (on_gpu and flash_attn_3_available()):
            raise ConfigError(
                "trainer.attn_implementation = 'flash_attention_3' needs trainer GPUs and the "
                "flash-attn Hopper package (flash_attn_interface) importable here: install it "
                "or set trainer.attn_implementation = 'auto'"
            )
        return
    if attn_implementation != FA2:
        return
    if not on_gpu:
        raise ConfigError(
            "trainer.attn_implementation = 'flash_attention_2' needs trainer GPUs "
            "(placement.trainer_gpus is empty): set trainer.attn_implementation = 'auto'"
        )
    if not flash_attn_2_available():
        raise ConfigError(
            "trainer.attn_implementation = 'flash_attention_2' but FlashAttention-2 does not "
            "import here (pip install 'flash-attn>=2.3.3,<3'; flash-attn-4 is not FA2): "
            "install it or set trainer.attn_implementation = 'auto' (SDPA)"
        )


def choose_attention(configured: str, on_gpu: bool, mixed_precision: bool) -> str:
    """'auto' on GPU: the flash-attn package's FA2 when it imports, else torch's varlen
    FlashAttention (bf16 compute, i.e. mixed precision), else per-sequence SDPA; on CPU
    per-sequence SDPA. Anything else stays as configured (check_attention vets it)."""
    if configured != "auto":
        return configured
    if not on_gpu:
        return attention.NAME
    if flash_attn_2_available():
        return FA2
    if mixed_precision and attention.torch_varlen_available():
        return attention.VARLEN
    return attention.NAME


_ATTN_WORDS = {
    attention.VARLEN: "torch's varlen FlashAttention over packed rows",
    attention.NAME: "causal SDPA per packed sequence",
    FA2: "flash-attn FlashAttention-2 varlen",
    FA3: "flash-attn FlashAttention-3 varlen",
}


def kernels_line(cfg: TrainerConfig, on_gpu: bool) -> str:
    """What the trainer will run, for the dry-run plan (as this machine's packages see it)."""
    from spade_async.trainer.liger import _model_type, liger_problem

    impl = choose_attention(cfg.attn_implementation, on_gpu, cfg.mixed_precision)
    why = "auto" if cfg.attn_implementation == "auto" else "as configured"
    if cfg.liger is False:
        liger = "off"
    else:
        problem = liger_problem(on_gpu, _model_type(cfg.model))
        liger = "RMSNorm/RoPE/SwiGLU patched" if problem is None else f"off ({problem})"
    return (
        f"trainer kernels: attention {impl} ({_ATTN_WORDS.get(impl, impl)}; {why}), "
        f"head {cfg.head}, liger {liger}, activation checkpointing "
        f"{checkpointing.mode_of(cfg.activation_checkpointing)}, AdamW "
        f"{'fused' if on_gpu else 'single-tensor (CPU)'}"
    )


def _attn_impl(cfg: TrainerConfig, device: torch.device) -> str:
    impl = choose_attention(cfg.attn_implementation, device.type == "cuda", cfg.mixed_precision)
    if impl not in _logged:  # once per process and choice
        _logged.add(impl)
        why = "as configured" if cfg.attn_implementation != "auto" else "auto"
        log.info("trainer attention: %s (%s, %s)", impl, why, device.type)
    return impl


def experts_kwargs(model_dir: str | Path) -> dict:
    """MoE models: experts through one grouped GEMM (transformers' ``grouped_mm`` experts
    implementation: torch's grouped_mm on CUDA bf16), never a Python loop over experts.
    Empty for dense models or a transformers without experts implementations."""
    import json

    cfg_file = Path(model_dir) / "config.json"
    if not cfg_file.is_file():
        return {}
    raw = json.loads(cfg_file.read_text())
    if not (raw.get("num_experts") or raw.get("num_local_experts")):
        return {}
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return {}
    return {"experts_implementation": "grouped_mm"} if "grouped_mm" in ALL_EXPERTS_FUNCTIONS else {}


def load_policy(
    cfg: TrainerConfig, model_dir: str | Path, device: torch.device, *, shard: bool
) -> PolicyModel:
    """fp32 policy, activations optionally checkpointed; with ``shard`` (ranks under
    torch.distributed) FSDP2-sharded and loaded shard by shard (sharded.py), so no rank
    holds the whole fp32 model."""
    from transformers import AutoModelForCausalLM

    impl = _attn_impl(cfg, device)
    if shard:
        from spade_async.trainer.sharded import load_sharded

        adapt = None
        if cfg.lora is not None:
            from spade_async.trainer.lora import inject

            adapt = lambda lm: inject(lm, cfg.lora, cfg.seed)  # noqa: E731
        return load_sharded(
            model_dir,
            device,
            attn_implementation=impl,
            wrap=lambda lm: _wrap(cfg, lm, device),
            adapt=adapt,
            offload=cfg.offload == "optimizer",  # shards on the host (sharded.placement)
            experts=experts_kwargs(model_dir),
        )
    causal_lm = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation=impl, **experts_kwargs(model_dir)
    )
    return _prepare(cfg, causal_lm, device).to(device)


def _prepare(cfg: TrainerConfig, causal_lm: nn.Module, device: torch.device) -> PolicyModel:
    from spade_async.trainer.liger import apply_liger

    apply_liger(causal_lm, cfg.liger, on_gpu=device.type == "cuda")  # before fully_shard
    if cfg.lora is not None and not getattr(causal_lm, "peft_config", None):
        from spade_async.trainer.lora import inject

        causal_lm = inject(causal_lm, cfg.lora, cfg.seed)  # frozen base + adapters
    checkpointing.apply(causal_lm, cfg.activation_checkpointing)
    causal_lm.train()
    return PolicyModel(causal_lm, cfg.temperature)


def _wrap(cfg: TrainerConfig, causal_lm: nn.Module, device: torch.device) -> PolicyModel:
    """PolicyModel + fully_shard per decoder block, then the root (on the meta model)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = _prepare(cfg, causal_lm, device)
    mp = None
    if cfg.mixed_precision and device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw = {"mp_policy": mp} if mp is not None else {}
    if cfg.offload == "optimizer":  # sharded fp32 weights, grads and AdamW states on the host
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    if cfg.hsdp:  # (nodes, ranks per node): replicate across nodes, shard within one
        from spade_async.launch.layout import hsdp_mesh

        kw["mesh"] = hsdp_mesh(device)
    for layer in decoder_layers(causal_lm):
        fully_shard(layer, **kw)
    fully_shard(policy, **kw)
    return policy
