"""Checkpoint resume across processes, HF export, and another-shape checkpoints."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_close_norm, forward_bound
from safetensors.torch import load_file
from trainer_batches import random_batch

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess

_batch = random_batch


def _cfg(model) -> TrainerConfig:
    # warm-up + cosine so the resumed schedule matters; old log-probs from the rollout so the
    # clipped ratio (not just the sign of the gradient) depends on the restored weights
    return TrainerConfig(
        model=str(model),
        lr=3e-3,
        warmup_steps=2,
        total_steps=4,
        old_logprobs="rollout",
        start_timeout_s=120,
    )


def test_resume_in_fresh_process_matches_straight_run(tiny_model, tmp_path):
    # 4 steps straight (saving after step 2 changes nothing), then a fresh torchrun that
    # loads the step-2 checkpoint and takes steps 3 and 4 again
    with TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "a") as client:
        lrs = [client.train_step(_batch(s))["lr"] for s in range(2)]
        client.save(str(tmp_path / "ck"))
        lrs += [client.train_step(_batch(s))["lr"] for s in (2, 3)]
        client.export_hf(str(tmp_path / "straight"))
    with TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "c") as client:
        loaded = client.load(str(tmp_path / "ck"))
        assert (loaded.step, loaded.version) == (2, 2)
        resumed_lrs = [client.train_step(_batch(s))["lr"] for s in (2, 3)]
        client.export_hf(str(tmp_path / "resumed"))
    assert resumed_lrs == lrs[2:]
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "model.safetensors")
    init = load_file(next(tiny_model.glob("*.safetensors")))
    assert a.keys() == b.keys()
    assert not torch.allclose(a["model.norm.weight"], init["model.norm.weight"])
    # the same float32 operations on the same restored floats (weights, Adam moments, RNG):
    # the arithmetic allows no difference at all
    for k in a:
        assert torch.equal(b[k], a[k]), k


def test_hf_export_loads_with_transformers_same_logits(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from spade_async.trainer.checkpoint import export_hf
    from spade_async.trainer.step import Trainer

    trainer = Trainer(_cfg(tiny_model), tiny_model)
    trainer.train_step(_batch(0))
    out = export_hf(trainer, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([_batch(1).samples[3].token_ids])
    with torch.no_grad():
        want = trainer.model.causal_lm(ids).logits
        got = hf(ids).logits
    # the export is a copy in the checkpoint's dtype (float32 here): bit for bit
    params = dict(trainer.model.causal_lm.named_parameters())
    for name, p in hf.named_parameters():
        assert torch.equal(p, params[name].detach()), name
    # same weights, possibly another kernel order: the float32 forward's rounding bound
    assert_close_norm(got, want, forward_bound(hf.config, ids.shape[1]), "exported logits")
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()


def test_two_rank_export_is_streamed_and_loads_with_transformers(tiny_model, tmp_path):
    """Two gloo ranks (FSDP2 shards): export_hf streams bucket by bucket; the directory
    loads with transformers and holds exactly the trained weights (the DCP checkpoint of
    the same step, loaded into one process)."""
    from transformers import AutoModelForCausalLM

    from spade_async.trainer.checkpoint import load_checkpoint
    from spade_async.trainer.step import Trainer

    with TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "run", nproc=2) as client:
        client.train_step(_batch(0))
        client.save(str(tmp_path / "ck"), hf_directory=str(tmp_path / "hf"))
    trainer = Trainer(_cfg(tiny_model), tiny_model)
    load_checkpoint(trainer, tmp_path / "ck")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    params = dict(trainer.model.causal_lm.named_parameters())
    init = load_file(next(tiny_model.glob("*.safetensors")))
    assert not torch.equal(params["model.norm.weight"].detach(), init["model.norm.weight"])
    for name, p in hf.named_parameters():
        assert torch.equal(p, params[name].detach()), name
    ids = torch.tensor([_batch(1).samples[3].token_ids])
    with torch.no_grad():
        want = trainer.model.causal_lm(ids).logits
        got = hf(ids).logits
    assert_close_norm(got, want, forward_bound(hf.config, ids.shape[1]), "exported logits")


def test_checkpoint_of_another_shape_is_one_clear_error(tiny_model, tmp_path):
    from spade_async.models import tiny_model_dir
    from spade_async.trainer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from spade_async.trainer.step import Trainer

    save_checkpoint(Trainer(_cfg(tiny_model), tiny_model), tmp_path / "ck")
    other = tiny_model_dir(tmp_path / "wide", hidden_size=32)
    trainer = Trainer(_cfg(other), other)
    with pytest.raises(
        CheckpointError,
        match=r"of shape \[49152, 64\] but this model's is "
        r"\[49152, 32\].*another model shape",
    ):
        load_checkpoint(trainer, tmp_path / "ck")
