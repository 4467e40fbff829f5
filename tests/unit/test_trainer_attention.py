"""Attention choice: FlashAttention-2 only when it really imports; a demand without it is one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from spade_async.cli import dispatch as cli
from spade_async.errors import ConfigError
from spade_async.trainer import attention, model
from spade_async.trainer.config import TrainerConfig

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "qwen3-8b-games.toml"


@pytest.fixture
def fresh_fa2_check(monkeypatch):
    """transformers caches its availability checks: clear them around the test."""
    from transformers.utils import import_utils

    import_utils.is_flash_attn_2_available.cache_clear()
    yield import_utils
    import_utils.is_flash_attn_2_available.cache_clear()


def test_flash_attn_folder_without_fa2_is_not_selected(tmp_path, monkeypatch, fresh_fa2_check):
    """A ``flash_attn/`` package with no flash-attn 2 distribution (what flash-attn-4 leaves)
    must not select flash_attention_2, even where CUDA is available."""
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.setattr(fresh_fa2_check, "is_torch_cuda_available", lambda: True)
    import importlib.util

    assert importlib.util.find_spec("flash_attn") is not None  # the folder is visible
    assert not model.flash_attn_2_available()
    cfg = TrainerConfig(attn_implementation="auto")
    assert model._attn_impl(cfg, torch.device("cuda")) == attention.VARLEN


def test_auto_picks_fa2_only_on_gpu_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(model, "flash_attn_2_available", lambda: True)
    monkeypatch.setattr(model, "_logged", set())
    cfg = TrainerConfig(attn_implementation="auto")
    with caplog.at_level(logging.INFO, logger=model.__name__):
        assert model._attn_impl(cfg, torch.device("cuda")) == model.FA2
        assert model._attn_impl(cfg, torch.device("cuda")) == model.FA2
        assert model._attn_impl(cfg, torch.device("cpu")) == attention.NAME
    lines = [r.getMessage() for r in caplog.records]
    assert sum("flash_attention_2" in m for m in lines) == 1, lines
    assert sum(attention.NAME in m for m in lines) == 1, lines
    monkeypatch.setattr(model, "flash_attn_2_available", lambda: False)
    assert model._attn_impl(cfg, torch.device("cuda")) == attention.VARLEN  # torch's own
    monkeypatch.setattr(attention, "torch_varlen_available", lambda: False)
    assert model._attn_impl(cfg, torch.device("cuda")) == attention.NAME
    fp32 = TrainerConfig(attn_implementation="auto", mixed_precision=False)
    monkeypatch.setattr(attention, "torch_varlen_available", lambda: True)
    assert model.choose_attention("auto", True, fp32.mixed_precision) == attention.NAME


def test_demanding_fa2_without_it_is_one_line(monkeypatch):
    model.check_attention("auto", on_gpu=False)  # nothing demanded: fine anywhere
    with pytest.raises(ConfigError, match="needs trainer GPUs"):
        model.check_attention("flash_attention_2", on_gpu=False)
    monkeypatch.setattr(model, "flash_attn_2_available", lambda: False)
    with pytest.raises(ConfigError, match="FlashAttention-2 does not import here"):
        model.check_attention("flash_attention_2", on_gpu=True)
    monkeypatch.setattr(model, "flash_attn_2_available", lambda: True)
    model.check_attention("flash_attention_2", on_gpu=True)


def test_dry_run_with_fa2_demanded_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(model, "flash_attn_2_available", lambda: False)
    argv = [
        "train",
        str(RECIPE),
        "--dry-run",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "trainer.attn_implementation=flash_attention_2",
    ]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "FlashAttention-2 does not import here" in err and "'auto'" in err
    assert not (tmp_path / "run").exists()


def test_demanding_torch_varlen_where_it_cannot_run_is_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="needs trainer GPUs"):
        model.check_attention(attention.VARLEN, on_gpu=False)
    monkeypatch.setattr(attention, "torch_varlen_available", lambda: False)
    with pytest.raises(ConfigError, match="has no torch.nn.attention.varlen"):
        model.check_attention(attention.VARLEN, on_gpu=True)
    with pytest.raises(ConfigError, match="flash_attention_3"):
        model.check_attention(model.FA3, on_gpu=False)


def test_varlen_call_matches_this_torch_signature():
    """The keyword set we pass exists on the installed torch's varlen_attn (causal via
    window_size on new releases, is_causal on old), and GQA repeats heads only without
    enable_gqa."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = frozenset(inspect.signature(varlen_attn).parameters)
    kw, repeat = attention.varlen_call_kwargs(params, 8, 2)
    assert set(kw) <= params
    assert kw.get("window_size") == (-1, 0) or kw.get("is_causal") is True
    assert repeat == ("enable_gqa" not in params)
    old = frozenset({"query", "key", "value", "is_causal", "scale"})
    assert attention.varlen_call_kwargs(old, 8, 2) == ({"is_causal": True}, True)


def test_per_sequence_sdpa_reads_bounds_once_per_micro_batch(monkeypatch):
    """With the bounds handed in, no layer converts cu_seqlens to a list (a host sync on
    GPU); the result equals attention computed sequence by sequence."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g) for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)

    class NoList(torch.Tensor):
        def tolist(self):
            raise AssertionError("cu_seqlens.tolist() inside a layer")

    mod = torch.nn.Module()
    mod.is_causal, mod.training = True, False
    out, _ = attention.varlen_sdpa(
        mod,
        q,
        k,
        v,
        None,
        cu_seq_lens_q=cu.as_subclass(NoList),
        **{attention.BOUNDS_KEY: (0, 4, 9)},
    )
    for a, b in ((0, 4), (4, 9)):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True
        ).transpose(1, 2)
        torch.testing.assert_close(out[:, a:b], ref, rtol=0, atol=1e-6)
    # the torch-varlen function on CPU tensors falls back to the same per-sequence path
    out2, _ = attention.varlen_torch(
        mod, q, k, v, None, cu_seq_lens_q=cu, **{attention.BOUNDS_KEY: (0, 4, 9)}
    )
    assert torch.equal(out2, out)


def test_varlen_without_a_scale_parameter_serves_only_the_default_scale():
    """torch's older varlen_attn (2.9/2.10: positional is_causal, return_aux, no scale;
    torch/nn/attention/varlen.py) always scales by 1/sqrt(head_dim): a module with another
    softmax scale must take the per-sequence path there, not get a silently wrong one."""
    from spade_async.trainer import attention

    old = frozenset({"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k",
                     "is_causal", "return_aux"})
    new = old | {"scale", "window_size", "enable_gqa"}
    assert attention.varlen_scale_ok(old, 128**-0.5, 128)
    assert attention.varlen_scale_ok(old, None, 128)
    assert not attention.varlen_scale_ok(old, 0.5 * 128**-0.5, 128)
    assert attention.varlen_scale_ok(new, 0.5 * 128**-0.5, 128)
