"""Weights leave the trainer in the engine's dtype, one bucket at a time (stream.py)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from spade_async.trainer import stream
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import push_distributed


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 3
    return t


def test_engine_dtype_follows_sglang_auto(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert stream.engine_dtype(tmp_path) == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32", "model_type": "qwen3"}))
    assert stream.engine_dtype(tmp_path) == torch.float16
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32", "model_type": "gemma2"}))
    assert stream.engine_dtype(tmp_path) == torch.bfloat16
    assert stream.engine_dtype(tmp_path, sglang_auto=False) == torch.float32  # disk files
    assert stream.engine_dtype(tmp_path, "float32") == torch.float32
    with pytest.raises(ValueError, match="'bf17' is not a torch dtype"):
        stream.engine_dtype(tmp_path, "bf17")


def test_buckets_are_gathered_one_at_a_time_in_engine_dtype(trainer, monkeypatch):
    """Nothing is gathered until its bucket is taken; every tensor is cast before it is
    full: the largest full tensor alive is one bucket's, never an fp32 model copy."""
    calls = []
    real = stream._full
    monkeypatch.setattr(stream, "_full", lambda p, d: calls.append(d) or real(p, d))
    gen = stream.bucketed(trainer, torch.bfloat16, bucket_bytes=1 << 20)
    assert calls == []  # planning touched no parameter data
    first = next(gen)
    assert len(calls) == len(first)  # exactly one bucket gathered
    assert all(t.dtype == torch.bfloat16 for _, t in first) and set(calls) == {torch.bfloat16}
    rest = list(gen)
    total = sum(t.numel() for p in trainer.model.parameters() for t in [p])
    tied = trainer.model.causal_lm.config.tie_word_embeddings
    sent = sum(t.numel() for b in [first, *rest] for _, t in b)
    assert sent == total  # every parameter once (the tied head is the embedding)
    assert tied and len(rest) >= 1
    params = dict(trainer.model.causal_lm.named_parameters())
    for name, t in [*first, *[x for b in rest for x in b]]:
        assert torch.equal(t, params[name].detach().to(torch.bfloat16))


def test_distributed_push_broadcasts_bf16(trainer):
    """Each bucket travels as one uint8 tensor (SGLang's flattened_bucket layout) whose
    metadata names bf16 for every parameter, and whose bytes are exactly bf16 tensors."""
    sent, dtypes = [], []

    def ok(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"weight_version": "3"})
        if request.url.path == "/update_weights_from_distributed":
            body = json.loads(request.content)
            assert body["load_format"] == "flattened_bucket"
            dtypes.extend(body["dtypes"])
        return httpx.Response(200, json={"success": True})

    trainer._weight_group = None
    push_distributed(
        trainer, [{"url": "http://a", "tp_size": 1}], master_address="127.0.0.1",
        master_port=29555, bucket_bytes=4 << 20, transport=httpx.MockTransport(ok),
        init_group=lambda *a: "G", broadcast=lambda t, g: sent.append(t),
        dtype="bfloat16",
    )
    assert sent and {t.dtype for t in sent} == {torch.uint8}
    assert dtypes and set(dtypes) == {"bfloat16"}
    n_params = sum(p.numel() for p in trainer.model.causal_lm.parameters())
    assert sum(t.numel() for t in sent) == 2 * n_params  # two bytes per bf16 value


@pytest.mark.parametrize("shard_bytes", [1 << 40, 4 << 20])
def test_export_is_loadable_in_engine_dtype(trainer, tmp_path, shard_bytes):
    from transformers import AutoModelForCausalLM

    out = stream.export_safetensors(trainer, tmp_path / "v3", torch.bfloat16, shard_bytes)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    if shard_bytes > 1 << 30:
        assert files == ["model.safetensors"]  # what the CPU engine's fast reload reads
    else:
        assert len(files) >= 2 and (out / "model.safetensors.index.json").is_file()
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    want = dict(trainer.model.causal_lm.named_parameters())
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, want[name].detach().to(torch.bfloat16)), name


def test_fsdp_shards_are_cast_before_the_gather(tiny_model, tmp_path):
    """Under FSDP2 (a one-rank gloo group here) parameters are DTensors: the cast happens on
    the shard and full_tensor() gathers the engine dtype."""
    import torch.distributed as dist

    from spade_async.trainer.step import Trainer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
        p = next(t.model.parameters())
        assert hasattr(p, "full_tensor")  # sharded
        got = [x for b in stream.bucketed(t, torch.bfloat16, 1 << 20) for x in b]
        assert got and all(type(x) is torch.Tensor and x.dtype == torch.bfloat16 for _, x in got)
        full = {n.removeprefix("causal_lm."): q.full_tensor() for n, q in t.model.named_parameters()}
        assert all(torch.equal(x, full[n].to(torch.bfloat16)) for n, x in got)
    finally:
        dist.destroy_process_group()
