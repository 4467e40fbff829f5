"""A model's shape and exact parameter counts, without torch or the weights.

Read from the model directory's ``config.json`` when it is here; otherwise from a built-in
table of the models the recipes name (matched by the directory's name, e.g.
``/models/Qwen3-30B-A3B``), so ``--dry-run`` plans a node before the weights are
downloaded. Counts are analytic for the decoder families the trainer runs (Llama/SmolLM,
Mistral, Qwen2, Qwen3, Qwen3-MoE); tests/unit/test_plan_memory.py checks them against
transformers' own meta-device models.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

__all__ = ["ModelShape", "model_shape", "KNOWN", "FAMILIES"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    model_type: str
    vocab: int
    hidden: int  # D
    layers: int  # L
    heads: int  # attention (query) heads
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width
    tied: bool  # lm_head shares the embedding
    experts: int = 0  # MoE experts per layer (0 = dense)
    moe_intermediate: int = 0
    experts_per_tok: int = 0
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    source: str = "config.json"  # or "built-in"

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def attn_params(self) -> int:
        D, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = D * q + 2 * D * kv + q * D
        if self.attention_bias:
            n += q + 2 * kv
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def mlp_params(self) -> int:
        D = self.hidden
        if self.experts:
            return D * self.experts + self.experts * 3 * D * self.moe_intermediate
        return 3 * D * self.intermediate

    @property
    def block_params(self) -> int:
        """One decoder block: attention + MLP (or router + experts) + its two RMSNorms."""
        return self.attn_params + self.mlp_params + 2 * self.hidden

    @property
    def root_params(self) -> int:
        """Outside the blocks: embedding, final norm, lm_head unless tied."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.root_params + self.layers * self.block_params

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each per-block linear a LoRA may target, peft's module names; expert
        weights are fused 3-D parameters in transformers 5 (not nn.Linear)."""
        D, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = {"q_proj": (D, q), "k_proj": (D, kv), "v_proj": (D, kv), "o_proj": (q, D)}
        if not self.experts:
            out |= {
                "gate_proj": (D, self.intermediate),
                "up_proj": (D, self.intermediate),
                "down_proj": (self.intermediate, D),
            }
        return out

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache of one token over every layer (K and V), whole model."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def _shape(name: str, raw: dict, source: str) -> ModelShape:
    raw = raw.get("text_config", raw)
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    experts = int(raw.get("num_experts") or 0) if raw.get("model_type") == "qwen3_moe" else 0
    if experts and (raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1)) != 1):
        raise ValueError(
            "qwen3_moe with dense layers mixed in (mlp_only_layers/decoder_sparse_step)"
        )
    return ModelShape(
        name=name,
        model_type=str(raw.get("model_type", "")),
        vocab=int(raw["vocab_size"]),
        hidden=hidden,
        layers=int(raw["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        intermediate=int(raw.get("intermediate_size") or 0),
        tied=bool(raw.get("tie_word_embeddings", False)),
        experts=experts,
        moe_intermediate=int(raw.get("moe_intermediate_size") or 0) if experts else 0,
        experts_per_tok=int(raw.get("num_experts_per_tok") or 0) if experts else 0,
        attention_bias=bool(raw.get("attention_bias", raw.get("model_type") == "qwen2")),
        source=source,
    )


def _qwen3(vocab=151936, **kw) -> dict:
    return {"model_type": "qwen3", "vocab_size": vocab, "head_dim": 128, **kw}


# The published config.json fields that size each model (Hugging Face hub, Qwen/* and
# HuggingFaceTB/*), keyed by the lower-cased directory name.
KNOWN: dict[str, dict] = {
    "qwen3-30b-a3b": {
        **_qwen3(),
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "tie_word_embeddings": False,
    },
    "qwen3-8b": _qwen3(
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=12288,
        tie_word_embeddings=False,
    ),
    "qwen3-4b": _qwen3(
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=9728,
        tie_word_embeddings=True,
    ),
    "smollm2-135m-instruct": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "tie_word_embeddings": True,
    },
}


def model_shape(model_dir: str | Path) -> ModelShape | None:
    """The shape of ``model_dir`` (its config.json, else the built-in table by name), or
    None for a model family the planner cannot count."""
    path = Path(model_dir).expanduser()
    cfg = path / "config.json"
    name = path.name
    if cfg.is_file():
        try:
            raw = json.loads(cfg.read_text())
            if raw.get("text_config", raw).get("model_type") not in FAMILIES:
                return None
            return _shape(name, raw, "config.json")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
    known = KNOWN.get(_base_name(name))
    return _shape(name, known, "built-in") if known is not None else None


# Checkpoints of the same architecture under another name: Qwen's 2507 Instruct/Thinking
# releases and Base checkpoints keep their model's config.json sizes.
_VARIANTS = ("-instruct-2507", "-thinking-2507", "-base")


def _base_name(name: str) -> str:
    low = name.lower()
    for suffix in _VARIANTS:
        if low.endswith(suffix) and low[: -len(suffix)] in KNOWN:
            return low[: -len(suffix)]
    return low
