"""trainer.liger: Liger-Kernel's RMSNorm / RoPE / SwiGLU patches on a tiny Qwen3 and Llama
give the unpatched model's log-probs and gradients (Triton's CPU interpreter in a child
process: Liger rebinds names in transformers' modeling modules process-wide, so the parent
must never be patched); auto falls back off GPU and says so once; true demands.

Tolerance: numerics.forward_bound (the fp32 sums of every layer, the head, the softmax)
for the logits; gradients go back through the same sums once more (2x).

Two gaps of Triton's interpreter (not of Liger's kernels) are bridged in the child only:
it hands Python floats to a kernel as Python floats, where compiled Triton passes fp32
scalars (Liger calls ``eps.to(tl.float32)``), and it has no libdevice ``rsqrt``.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spade_async.errors import ConfigError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_LIGER = importlib.util.find_spec("liger_kernel") is not None
child_only = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child")
N_CHILD_TESTS = 2


def _bridge_interpreter() -> None:
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    orig = interp._implicit_cvt

    def cvt(arg):
        if isinstance(arg, float):
            handle = interp.TensorHandle(np.array([arg], dtype=np.float32), tl.float32)
            return tl.tensor(handle, tl.float32)
        return orig(arg)

    interp._implicit_cvt = cvt
    import liger_kernel.ops.rms_norm as rms

    rms.rsqrt = lambda x: 1.0 / tl.sqrt(x)


if INTERPRETED and HAVE_LIGER:
    _bridge_interpreter()


@pytest.mark.skipif(INTERPRETED, reason="this is the parent")
@pytest.mark.skipif(not HAVE_LIGER, reason="liger-kernel not installed")
@pytest.mark.timeout(300)
def test_patched_models_under_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        __file__,
        "-k",
        "matches",
    ]
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=280)
    tail = r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) == N_CHILD_TESTS, tail


def _tiny(family: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=64,
    )
    config = Qwen3Config(**shape) if family == "qwen3" else LlamaConfig(**shape)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def _logprobs_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    lp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])
    lp.sum().backward()
    return lp.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@child_only
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_liger_patch_matches_unpatched(family):
    from numerics import assert_close_norm, forward_bound

    from spade_async.trainer.liger import apply_liger

    plain = _tiny(family)
    patched = copy.deepcopy(plain)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    lp0, g0 = _logprobs_and_grads(plain, ids)  # before any patch touches the module globals
    choice = apply_liger(patched, True, on_gpu=False, interpret=True)
    assert choice.startswith("liger: apply_liger_kernel_to_")
    layer = patched.model.layers[0]
    norms = [layer.input_layernorm, patched.model.norm]
    if family == "qwen3":
        norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]  # Qwen3's per-head norms
    assert all(
        "Liger" in type(n.forward.__self__).__name__ or "liger" in n.forward.__func__.__module__
        for n in norms
    )
    assert "liger" in layer.mlp.forward.__func__.__module__
    lp1, g1 = _logprobs_and_grads(patched, ids)
    bound = forward_bound(plain.config, ids.shape[1])
    assert_close_norm(lp1, lp0.double(), bound, "log-probs")
    assert_close_norm(g1, g0.double(), 2 * bound, "gradients")
    assert g0.abs().sum() > 0


def test_auto_falls_back_off_gpu_and_logs_once(monkeypatch, caplog):
    from spade_async.trainer import liger

    monkeypatch.setattr(liger, "_logged", set())
    model = _tiny("llama")
    with caplog.at_level(logging.INFO, logger=liger.__name__):
        assert liger.apply_liger(model, "auto", on_gpu=False).startswith("off (needs trainer GPUs")
        liger.apply_liger(model, "auto", on_gpu=False)
    assert sum("trainer kernels: off" in r.getMessage() for r in caplog.records) == 1
    assert liger.apply_liger(model, False, on_gpu=True) == "off (trainer.liger = false)"
    with pytest.raises(ConfigError, match="trainer.liger = true but Liger needs trainer GPUs"):
        liger.apply_liger(model, True, on_gpu=False)


def test_true_demands_a_supported_family(monkeypatch, tmp_path):
    from spade_async.trainer import liger
    from spade_async.trainer.config import TrainerConfig

    if not HAVE_LIGER:
        with pytest.raises(ConfigError, match="needs liger-kernel"):
            liger.check_liger(TrainerConfig(liger=True), on_gpu=True)
        return
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ConfigError, match="no patch for model_type 'gpt2'"):
        liger.check_liger(TrainerConfig(model=str(tmp_path), liger=True), on_gpu=True)
    liger.check_liger(TrainerConfig(model=str(tmp_path), liger="auto"), on_gpu=False)  # no demand


def test_dry_run_names_the_kernels_and_refuses_liger_true_off_gpu(tmp_path, capsys, monkeypatch):
    from spade_async.cli import dispatch as cli
    from spade_async.trainer import liger

    recipe = Path(__file__).resolve().parents[2] / "configs" / "qwen3-8b-games.toml"
    base = ["train", str(recipe), "--dry-run", "--run-dir", str(tmp_path / "run")]
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("trainer kernels:"))
    assert "attention " in line and "head fused" in line and "activation checkpointing full" in line
    monkeypatch.setattr(liger.importlib.util, "find_spec", lambda name: None)  # no liger here
    code = cli.main([*base, "--set", "trainer.liger=true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "trainer.liger = true but Liger needs triton" in err
    assert not (tmp_path / "run").exists()
