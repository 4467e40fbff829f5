"""Attention choice: FlashAttention-2 only when it really imports; a demand without it is one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from spade_async.cli import main as cli
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
    assert model._attn_impl(cfg, torch.device("cuda")) == attention.NAME


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
    assert model._attn_impl(cfg, torch.device("cuda")) == attention.NAME


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
    argv = ["train", str(RECIPE), "--dry-run", "--run-dir",
            str(tmp_path / "run"), "--set", "trainer.attn_implementation=flash_attention_2"]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "FlashAttention-2 does not import here" in err and "'auto'" in err
    assert not (tmp_path / "run").exists()
