"""The dry run's memory plan (spade_async/plan/) against numbers worked by hand.

Qwen3-30B-A3B (config.json: V 151,936, D 2,048, L 48, 32 heads, 4 KV heads, head_dim 128,
128 experts of width 768, 8 per token, untied):

  attention per block  q 2048x4096 + k 2048x512 + v 2048x512 + o 4096x2048
                       = 8,388,608 + 1,048,576 + 1,048,576 + 8,388,608 = 18,874,368
                       + q/k norms 2 x 128 = 18,874,624
  MoE per block        router 2048 x 128 = 262,144 + experts 128 x 3 x 2048 x 768
                       = 603,979,776 -> 604,241,920
  block B              18,874,624 + 604,241,920 + 2 norms x 2048 = 623,120,640
  root Q               embed + lm_head 2 x 151,936 x 2048 = 622,329,856 + norm 2048
                       = 622,331,904
  P                    Q + 48 B = 622,331,904 + 29,909,790,720 = 30,532,122,624

Full fine-tuning over R = 6 ranks, bf16 compute (c = 2):
  params    4P/6 + 2(Q + 2B) = 20,354,748,416 + 2 x 1,868,573,184 = 24,091,894,784
  grads     4P/6 + (2 + 4) max(B, Q) = 20,354,748,416 + 6 x 623,120,640 = 24,093,472,256
  optimizer 8P/6 = 40,709,496,832
Activations at T = 26,832 tokens, checkpointing on: q = 4096, kv = 512,
  e_a = 2x2048 + (4096 + 1024) + (4096 + 512) + (4096 + 512) [q/k norm] + 4096 = 22,528
  e_m = 2x2048 + 8 (2048 + 4 x 768) = 45,056; fp32 terms 4 x 32 + 4 x 128 = 640 bytes
  one block  26,832 x (2 x 67,584 + 640) = 26,832 x 135,808 = 3,644,000,256
  inputs     48 x 26,832 x 2048 x 2 = 5,275,385,856
  head etc.  3 x 26,832 x 2048 x 2 = 329,711,616, chunk buffers 2 x 96 Mi x 2 = 402,653,184
  total      3,644,000,256 + 5,275,385,856 + 329,711,616 + 402,653,184 = 9,651,750,912
Reserve on an H100 (81,559 MiB = 85,520,809,984 B): 2 GiB + int(0.05 x 85,520,809,984)
  = 2,147,483,648 + 4,276,040,499 = 6,423,524,147.
Total 24,091,894,784 + 24,093,472,256 + 40,709,496,832 + activations + reserve > 85.5 GB:
does not fit; with offload "optimizer" params 2(Q + 2B) + 4B/6 = 3,737,146,368 + 415,413,760
= 4,152,560,128, grads 6B + 4B/6 = 4,154,137,600, optimizer 0, host 16P/6 = 81,418,993,664.

LoRA rank 16 on Qwen3-8B (D 4096, kv 1024, I 12,288, L 36), all seven linears:
  r (in + out) summed: q 8192 + k 5120 + v 5120 + o 8192 + gate 16,384 + up 16,384 + down 16,384
  = 75,776; x 16 x 36 = 43,646,976 adapter params; P(8B) = 8,190,735,360, so a push is
  43,646,976 / 8,190,735,360 = 0.53% of a full one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_async import placement, recipe
from spade_async.errors import ConfigError
from spade_async.plan.gpus import GPUS, gpu_by_name
from spade_async.plan.memory import (
    GIB,
    HEAD_CHUNK_ELEMS,
    RESERVE_BYTES,
    lora_params,
    plan_memory,
    trainer_gpu,
)
from spade_async.plan.shapes import KNOWN, model_shape
from spade_async.trainer.config import LoraConfig

ROOT = Path(__file__).resolve().parents[2]
H100 = GPUS["h100-80gb"]


def test_parameter_counts_by_hand():
    s = model_shape("/models/Qwen3-30B-A3B")  # not on this machine: the built-in shape
    assert s.source == "built-in"
    assert s.attn_params == 18_874_624
    assert s.mlp_params == 604_241_920
    assert s.block_params == 623_120_640
    assert s.root_params == 622_331_904
    assert s.params == 30_532_122_624
    assert model_shape("/models/Qwen3-8B").params == 8_190_735_360
    assert model_shape("/models/not-a-known-model") is None


@pytest.mark.parametrize(
    "extra",
    [
        {"model_type": "llama", "tie_word_embeddings": True},
        {"model_type": "qwen2", "tie_word_embeddings": False},
        {"model_type": "qwen3", "head_dim": 24, "tie_word_embeddings": False},
        {
            "model_type": "qwen3_moe",
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "head_dim": 16,
        },
    ],
)
def test_counts_equal_transformers_meta_models(extra, tmp_path):
    """The analytic counts are transformers' own (a meta-device model of each family)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {
        "vocab_size": 211,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **extra,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = AutoConfig.from_pretrained(str(tmp_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.model.layers[0].parameters())
    s = model_shape(tmp_path)
    assert (s.params, s.block_params) == (want, block)


def test_full_fine_tuning_30b_on_six_h100s_by_hand():
    s = model_shape("/models/Qwen3-30B-A3B")
    t = trainer_gpu(s, ranks=6, capacity=H100.memory_bytes, tokens=26_832)
    assert t.params == 24_091_894_784
    assert t.grads == 24_093_472_256
    assert t.optimizer == 40_709_496_832
    one_block = 26_832 * (2 * (22_528 + 45_056) + 640)
    assert one_block == 3_644_000_256
    inputs = 48 * 26_832 * 2048 * 2
    head = 3 * 26_832 * 2048 * 2 + 2 * HEAD_CHUNK_ELEMS * 2
    assert inputs == 5_275_385_856 and head == 329_711_616 + 402_653_184
    assert t.activations == one_block + inputs + head == 9_651_750_912
    assert t.reserve == RESERVE_BYTES + int(0.05 * 85_520_809_984) == 6_423_524_147
    assert not t.fits and t.margin < 0
    o = trainer_gpu(s, ranks=6, capacity=H100.memory_bytes, tokens=26_832, offload="optimizer")
    assert (o.params, o.grads, o.optimizer) == (4_152_560_128, 4_154_137_600, 0)
    assert o.host_pinned == 16 * s.params // 6 == 81_418_993_664
    assert o.activations == t.activations and o.fits


def test_checkpointing_and_sequence_parallel_scale_activations():
    s = model_shape("/models/Qwen3-8B")
    kw = dict(ranks=4, capacity=H100.memory_bytes, tokens=32_768)
    on = trainer_gpu(s, **kw)
    off = trainer_gpu(s, **kw, activation_checkpointing=False)
    sp2 = trainer_gpu(s, **kw, sequence_parallel=2)
    head = 2 * HEAD_CHUNK_ELEMS * 2
    # without checkpointing every block keeps its whole set: L x one block + the rest
    per_block = on.activations - head - 3 * 32_768 * 4096 * 2 - 36 * 32_768 * 4096 * 2
    assert off.activations == 36 * per_block + 3 * 32_768 * 4096 * 2 + head
    # SP 2: half the tokens per rank, plus the all-to-all buffers c t (2q + 2kv)
    half = trainer_gpu(s, **{**kw, "tokens": 16_384})
    assert sp2.activations == half.activations + 2 * 16_384 * (2 * 4096 + 2 * 1024)


def test_lora_push_and_memory_targets_on_8b():
    s = model_shape("/models/Qwen3-8B")
    lora = LoraConfig(rank=16)
    assert lora_params(s, 16, list(lora.target_modules)) == 43_646_976
    assert 2 * 43_646_976 / (2 * s.params) <= 0.01  # the push: adapters only, <= 1%
    kw = dict(ranks=4, capacity=H100.memory_bytes, tokens=32_768, kl_reference=True)
    full, ada = trainer_gpu(s, **kw), trainer_gpu(s, **kw, lora=lora)
    assert ada.reference == 0  # the base with the adapters off is the KL reference
    assert ada.trainer <= 0.40 * full.trainer


def test_dry_run_h100_recipe_fits_and_without_offload_names_it(tmp_path):
    cfg = recipe.load(ROOT / "configs" / "qwen3-30b-a3b-games-h100.toml")
    base = recipe.load(ROOT / "configs" / "qwen3-30b-a3b-games.toml")
    # the H100 recipe is the H200 one's method, with offload
    assert cfg.trainer == type(cfg.trainer)(
        **{
            **{f: getattr(base.trainer, f) for f in base.trainer.__struct_fields__},
            "offload": "optimizer",
        }
    )
    text = placement.describe(cfg, tmp_path / "run", gpu="h100-80gb")
    assert "memory plan on h100-80gb" in text
    line = next(ln for ln in text.splitlines() if "trainer GPU fits: margin" in ln)
    assert float(line.split("margin ")[1].split()[0]) > 0
    plan = plan_memory(cfg, model_shape(cfg.model), H100)
    assert plan.trainer.fits and plan.engines[0].kv_tokens > plan.sample_tokens
    plain = recipe.load(
        ROOT / "configs" / "qwen3-30b-a3b-games-h100.toml", ["trainer.offload=none"]
    )
    text = placement.describe(plain, tmp_path / "run", gpu="h100-80gb")
    assert "trainer GPU does NOT fit" in text and 'set trainer.offload = "optimizer"' in text
    # the H200 recipe as shipped fits its GPU without offload
    assert plan_memory(base, model_shape(base.model), GPUS["h200-141gb"]).trainer.fits


def test_dry_run_32k_sample_at_8b_with_sp2_fits_an_h100(tmp_path):
    cfg = recipe.load(
        ROOT / "configs" / "qwen3-8b-games.toml",
        ["trainer.sequence_parallel=2", "trainer.micro_batch_tokens=8192"],
    )
    plan = plan_memory(cfg, model_shape(cfg.model), H100, sample_tokens=32_768)
    assert plan.trainer.tokens == 32_768 and plan.trainer.fits
    text = placement.describe(cfg, tmp_path / "r", gpu="h100-80gb", sample_tokens=32_768)
    assert "32768 tokens (16384 per rank)" in text


def test_unknown_gpu_and_bad_knobs_are_one_line_errors(capsys):
    with pytest.raises(ConfigError, match="h100-80gb"):
        gpu_by_name("rtx-9090")
    from spade_async.cli import dispatch as cli

    r30 = str(ROOT / "configs" / "qwen3-30b-a3b-games.toml")
    r8 = str(ROOT / "configs" / "qwen3-8b-games.toml")
    cases = [
        (r30, "trainer.lora={rank=8,target_modules=['q_proj','gate_proj']}", "gate_proj"),
        (r8, "trainer.sequence_parallel=3", "sequence_parallel = 3"),
        ("configs/cpu-demo.toml", "trainer.offload=optimizer", "trainer.offload"),
        (r8, "trainer.lora={rank=0}", "trainer.lora.rank = 0 is out of range: must be in [1, "),
    ]
    for path, override, words in cases:
        code = cli.main(
            [
                "train",
                str(ROOT / path) if not path.startswith("/") else path,
                "--dry-run",
                "--set",
                override,
            ]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2, override
        assert len(err.splitlines()) == 1 and words in err, err


def test_named_gpu_table():
    assert gpu_by_name("H200-141GB").memory_bytes == 143_771 << 20
    assert KNOWN["qwen3-30b-a3b"]["num_experts"] == 128
    assert H100.memory_bytes / GIB == pytest.approx(79.65, abs=0.01)
