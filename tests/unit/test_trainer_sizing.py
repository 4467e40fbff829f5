"""The dry-run plan's trainer memory line (sizing.py), from exact meta-model counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_async import placement, recipe
from spade_async.trainer.sizing import GIB, estimate, memory_line

ROOT = Path(__file__).resolve().parents[2]

# Qwen/Qwen3-30B-A3B's config.json (the fields that size it)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": True,
}


@pytest.fixture(scope="module")
def qwen30b(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("qwen3-30b-a3b")
    (d / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    return d


def test_qwen3_30b_a3b_over_six_ranks(qwen30b):
    m = estimate(qwen30b, 6, mixed_precision=True, on_gpu=True)
    assert abs(m.params - 30.5e9) / 30.5e9 < 0.01  # the model card's 30.5B
    assert m.state_gib == pytest.approx(16 * m.params / 6 / GIB)
    assert 80 * 1e9 / GIB < m.state_gib < 82 * 1e9 / GIB  # the recipe's "81 GB per rank"
    assert m.host_gib == pytest.approx(2 * m.params / GIB)  # bf16 checkpoint on rank 0's host
    assert 0 < m.unsharded_gib < 10


def test_dry_run_states_the_per_gpu_memory(qwen30b, tmp_path):
    cfg = recipe.load(ROOT / "configs" / "qwen3-30b-a3b-games.toml", [f"model={qwen30b}"])
    text = placement.describe(cfg, tmp_path / "run")
    line = next(ln for ln in text.splitlines() if ln.startswith("trainer memory per GPU"))
    assert "~81.6 GiB before activations" in line and "over 6 rank(s)" in line
    assert text.index(line) < text.index("commands:")


def test_unknown_model_says_so(tmp_path):
    line = memory_line(tmp_path / "absent", 4, mixed_precision=True, on_gpu=True)
    assert line.startswith("trainer memory per GPU: unknown here (no config.json")
