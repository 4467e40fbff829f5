"""trainer.lora (trainer/lora.py): peft adapters on the frozen base, in one process.

Only the adapters train; the KL reference is the base with the adapters off; the export's
merged model is W + (alpha / r) B A and its adapter/ directory loads with peft's own
PeftModel onto the base with the same logits; a checkpoint resumes bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from numerics import assert_close_norm, forward_bound
from safetensors.torch import load_file
from trainer_batches import random_batch

from spade_async.errors import ConfigError
from spade_async.trainer.config import LoraConfig, TrainerConfig

pytest.importorskip("peft", reason="peft is a project dependency (pip install peft)")

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


_batch = random_batch


def _cfg(model, **kw) -> TrainerConfig:
    return TrainerConfig(model=str(model), lr=1e-2, **{"lora": LORA, **kw})


# peft 0.21's PeftModel reads transformers' deprecated is_gradient_checkpointing
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_only_adapters_train_and_export_merges(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from spade_async.trainer.checkpoint import export_hf
    from spade_async.trainer.step import Trainer

    trainer = Trainer(_cfg(tiny_model), tiny_model)
    named = dict(trainer.model.causal_lm.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 3 * 2  # A and B x 3 targets x 2 layers
    opt = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert opt == {id(named[n]) for n in trainable}
    before = {n: p.detach().clone() for n, p in named.items()}
    for s in range(2):
        trainer.train_step(_batch(s))
    for n, p in named.items():
        changed = not torch.equal(p.detach(), before[n])
        # A moves; B starts at 0 and moves; every base weight stays exactly as loaded
        assert changed == (n in trainable), n
    out = export_hf(trainer, tmp_path / "hf")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    m = "model.layers.1.self_attn.q_proj"
    a, b = named[f"{m}.lora_A.default.weight"], named[f"{m}.lora_B.default.weight"]
    want = named[f"{m}.base_layer.weight"] + (LORA.alpha / LORA.rank) * (b @ a)
    assert_close_norm(
        dict(merged.named_parameters())[f"{m}.weight"].detach(),
        want.detach().double(),
        forward_bound(merged.config, LORA.rank),
        "merged q_proj",
    )
    # the merged export and peft's adapter on the base give the trainer's logits
    adapter = out / "adapter"
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert (meta["peft_type"], meta["r"], meta["lora_alpha"]) == ("LORA", 4, 8.0)
    peft_model = PeftModel.from_pretrained(base, str(adapter))
    ids = torch.tensor([_batch(3).samples[3].token_ids])
    with torch.no_grad():
        ref = trainer.model.causal_lm(ids).logits.double()
        got_merged = merged(ids).logits
        got_peft = peft_model(ids).logits
    bound = forward_bound(merged.config, ids.shape[1])
    assert_close_norm(got_merged, ref, bound, "merged logits")
    assert_close_norm(got_peft, ref, bound, "peft adapter logits")
    fresh = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():  # (peft injected its layers into `base` in place)
        plain = fresh(ids).logits.double()
    assert (plain - ref).norm() > 100 * bound * ref.norm()  # the adapter changed the model
    adapter_bytes = (adapter / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < 0.05 * (out / "model.safetensors").stat().st_size


def test_kl_reference_is_the_base_with_adapters_off(tiny_model):
    from spade_async.trainer.lora import adapters_off
    from spade_async.trainer.step import Trainer

    trainer = Trainer(_cfg(tiny_model, kl_coef=0.1), tiny_model)
    assert trainer.ref_model is None and trainer.ref_adapters_off  # no second copy
    trainer.train_step(_batch(0))
    trainer.train_step(_batch(1))
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    ids = torch.tensor([_batch(2).samples[2].token_ids])
    with torch.no_grad(), adapters_off(trainer.model):
        off = trainer.model.causal_lm(ids).logits
    with torch.no_grad():
        on = trainer.model.causal_lm(ids).logits
        want = base(ids).logits
    assert torch.equal(off, want)  # the same base weights, the same ops: bit for bit
    assert not torch.equal(on, want)


def test_checkpoint_holds_the_adapter_and_resumes(tiny_model, tmp_path):
    from spade_async.trainer.checkpoint import export_hf, load_checkpoint, save_checkpoint
    from spade_async.trainer.step import Trainer

    a = Trainer(_cfg(tiny_model), tiny_model)
    a.train_step(_batch(0))
    save_checkpoint(a, tmp_path / "ck")
    a.train_step(_batch(1))
    export_hf(a, tmp_path / "straight")
    b = Trainer(_cfg(tiny_model), tiny_model)
    load_checkpoint(b, tmp_path / "ck")
    b.train_step(_batch(1))
    export_hf(b, tmp_path / "resumed")
    x = load_file(tmp_path / "straight" / "adapter" / "adapter_model.safetensors")
    y = load_file(tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert x.keys() == y.keys() and len(x) == 12
    for k in x:
        assert torch.equal(x[k], y[k]), k


def test_absent_target_module_is_a_config_error(tiny_model):
    from spade_async.trainer.step import Trainer

    with pytest.raises(ConfigError, match="wq"):
        Trainer(_cfg(tiny_model, lora=LoraConfig(target_modules=("wq",))), tiny_model)


def test_adapter_push_serves_the_policy_and_unloads_old_versions(tiny_model, tmp_path):
    """Each push sends only the adapter under a new name; the engine then serves exactly
    the trainer's policy for requests naming it; the one before stays loaded (samples of
    version v-1 may still be generating), older ones are unloaded."""
    import httpx
    from safetensors.torch import load_file as load

    from spade_async.generation.server import make_engine_app, serve_in_thread
    from spade_async.trainer.checkpoint import export_hf
    from spade_async.trainer.lora import push_adapter
    from spade_async.trainer.step import Trainer

    trainer = Trainer(_cfg(tiny_model), tiny_model)
    app = make_engine_app(str(tiny_model), context_length=64, enable_lora=True, max_lora_rank=4)
    shm = tmp_path / "shm"
    prompt = [1, 5, 9, 13]
    with serve_in_thread(app) as url:
        trainer.train_step(_batch(0))
        assert push_adapter(trainer, [url], shm_dir=str(shm)) == {url: "spade-v1"}
        out = httpx.post(
            f"{url}/generate",
            timeout=60,
            json={
                "input_ids": prompt,
                "lora_path": "spade-v1",
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3, "temperature": 0.0},
            },
        ).json()
        for s in (1, 2):
            trainer.train_step(_batch(s))
            push_adapter(trainer, [url], shm_dir=str(shm))
        assert sorted(app.lora.loaded()) == ["spade-v2", "spade-v3"]
    exports = sorted(p.name for p in shm.rglob("lora-v*") if p.is_dir())
    assert exports == ["lora-v2", "lora-v3"]
    # the payload: the adapter tensors only, r (in + out) per target per layer, as the
    # dry run's planner counts them (plan/memory.py)
    from spade_async.plan.memory import lora_params
    from spade_async.plan.shapes import model_shape

    sent = load(next(shm.rglob("lora-v3/adapter_model.safetensors")))
    n = sum(t.numel() for t in sent.values())
    shape = model_shape(tiny_model)
    assert n == lora_params(shape, 4, list(LORA.target_modules)) == 3328
    assert n < 0.01 * shape.params
    # what spade-v1 served is the trainer's version-1 policy (from its merged export)
    b = Trainer(_cfg(tiny_model), tiny_model)
    b.train_step(_batch(0))
    export_hf(b, tmp_path / "v1")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "v1", dtype=torch.float32)
    ids = torch.tensor([prompt + out["output_ids"]])
    with torch.no_grad():
        lp = torch.log_softmax(merged(ids).logits[0].double(), -1)
    want = torch.tensor(
        [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out["output_ids"])]
    )
    got = torch.tensor([row[0] for row in out["meta_info"]["output_token_logprobs"]])
    assert_close_norm(got, want, forward_bound(merged.config, ids.shape[1]), "served log-probs")


def test_adapter_push_for_the_loop_takes_a_free_name_and_unloads_nothing(tiny_model, tmp_path):
    """The run loop's push (keep < 0, loop/lora.py): a version whose name an engine still
    holds is loaded as spade-v{N}.1 (the CPU engine, like SGLang, refuses a second load of a
    name); nothing is unloaded by the trainer; only the newest export stays on disk."""
    from spade_async.generation.server import make_engine_app, serve_in_thread
    from spade_async.trainer.lora import push_adapter
    from spade_async.trainer.step import Trainer

    trainer = Trainer(_cfg(tiny_model), tiny_model)
    app = make_engine_app(str(tiny_model), context_length=64, enable_lora=True, max_lora_rank=4)
    shm = tmp_path / "shm"
    with serve_in_thread(app) as url:
        trainer.train_step(_batch(0))
        assert push_adapter(trainer, [url], shm_dir=str(shm), keep=-1) == {url: "spade-v1"}
        got = push_adapter(trainer, [url], shm_dir=str(shm), keep=-1, taken=["spade-v1"])
        assert got == {url: "spade-v1.1"}
        trainer.train_step(_batch(1))
        push_adapter(trainer, [url], shm_dir=str(shm), keep=-1, taken=["spade-v1", "spade-v1.1"])
        assert sorted(app.lora.loaded()) == ["spade-v1", "spade-v1.1", "spade-v2"]
        assert app.sgl.refused() == []
    assert sorted(p.name for p in shm.rglob("lora-v*") if p.is_dir()) == ["lora-v2"]
