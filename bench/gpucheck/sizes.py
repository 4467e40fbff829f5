"""Problem sizes per run mode: full (H200, <= 8 min in all), quick (GPU, small), cpu (tiny)."""

from __future__ import annotations

import copy

# Qwen3-shaped ~1.1B: Qwen3-1.7B's widths (hidden 2048, 16 q / 8 kv heads of 128, MLP 6144,
# vocab 151,936, tied embeddings) at 16 layers instead of 28.
QWEN3_1B = dict(
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
)

# the end-to-end part's model: Qwen3 blocks at SmolLM2-135M's scale (vocabulary from the tokenizer)
SMOKE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
)

FULL = {
    "peak": {"n": 8192, "reps": 100, "dtype": "bfloat16"},
    "kernels": {
        "accuracy": {"T": 1024, "V": 151936, "D": 4096},
        "timing": {"T": [4096, 16384], "V": 151936, "D": 4096, "reps": 3},
        "loss_T": 16384,
    },
    "trainer": {
        "model": QWEN3_1B,
        "batch_tokens": 32768,
        "micro_batch_tokens": 16384,
        "min_len": 256,
        "max_len": 4096,
        "steps": 3,
    },
    "export": {"bucket_mib": 512, "pushes": 2},
    "attention": {
        "T": 32768,
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 128,
        "min_len": 256,
        "max_len": 4096,
        "reps": 5,
    },
    "moe": {
        "model": dict(
            hidden_size=1024,
            intermediate_size=3072,
            moe_intermediate_size=768,
            num_experts=64,
            num_experts_per_tok=8,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            vocab_size=32768,
        ),
        "T": 4096,
        "reps": 3,
    },
    "scale": {"lora_rank": 16, "steps": 2, "row_tokens": 32768},
    # spade train configs/gpu-smoke.toml: a Qwen3-shaped 57M (SmolLM2's vocabulary, which
    # the carried tokenizer has) that the CPU engine generates with on 16 cores
    "e2e": {"model": SMOKE, "steps": 4, "timeout_s": 215},
    # per part, seconds; a part past its budget fails (PartTimeout), the run goes on. The
    # default parts add up to 480 s (8 minutes of device time); the H200 run of 2026-11-30
    # took 35 s for peak, kernels, trainer and export together
    "budget_s": {
        "peak": 15,
        "kernels": 45,
        "trainer": 60,
        "export": 20,
        "attention": 20,
        "moe": 25,
        "sglang": 5,
        "scale": 60,
        "e2e": 230,
    },
}

QUICK = copy.deepcopy(FULL)
QUICK["peak"].update(n=4096, reps=50)
QUICK["kernels"] = {
    "accuracy": {"T": 256, "V": 32768, "D": 1024},
    "timing": {"T": [1024, 4096], "V": 32768, "D": 1024, "reps": 3},
    "loss_T": 4096,
}
QUICK["trainer"].update(
    model=dict(
        QWEN3_1B,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=32768,
    ),
    batch_tokens=8192,
    micro_batch_tokens=4096,
    max_len=2048,
    steps=2,
)
QUICK["attention"].update(T=8192, max_len=2048)
QUICK["moe"].update(T=1024, reps=2)
QUICK["budget_s"] = dict(FULL["budget_s"], e2e=180)
QUICK["scale"] = {"lora_rank": 16, "steps": 1, "row_tokens": 8192}
QUICK["e2e"] = {"model": dict(SMOKE, num_hidden_layers=4), "steps": 3, "timeout_s": 160}
QUICK["budget_s"]["e2e"] = 180

CPU = copy.deepcopy(QUICK)
CPU["peak"] = {"n": 512, "reps": 5, "dtype": "float32"}
CPU["kernels"] = {
    "accuracy": {"T": 64, "V": 1000, "D": 64},
    "timing": {"T": [256], "V": 4096, "D": 128, "reps": 2},
    "loss_T": 1024,
}
CPU["trainer"].update(
    model=dict(
        QWEN3_1B,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
    ),
    batch_tokens=1024,
    micro_batch_tokens=512,
    min_len=16,
    max_len=256,
    steps=1,
)
CPU["export"] = {"bucket_mib": 1, "pushes": 2}
CPU["attention"] = {
    "T": 512,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "min_len": 16,
    "max_len": 128,
    "reps": 2,
}
CPU["moe"] = {
    "model": dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
    ),
    "T": 128,
    "reps": 2,
}
CPU["budget_s"] = {
    "peak": 30,
    "kernels": 60,
    "trainer": 150,
    "export": 60,
    "attention": 30,
    "moe": 60,
    "sglang": 10,
    "scale": 120,
}
CPU["scale"] = {"lora_rank": 4, "steps": 1, "row_tokens": 512}
CPU["e2e"] = {
    "model": dict(
        SMOKE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "steps": 2,
    "timeout_s": 420,
}
CPU["budget_s"]["e2e"] = 450


def pick(device: str, quick: bool) -> dict:
    if device == "cpu":
        return copy.deepcopy(CPU)
    return copy.deepcopy(QUICK if quick else FULL)
