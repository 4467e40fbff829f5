"""Contract tests of the weight-push requests (fake HTTP transport, fake NCCL/IPC)."""

from __future__ import annotations

import httpx
import pytest
import torch
from sglang_fake import FakeNCCL, ModelledSGLang, transport

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import (
    WeightPushError,
    buckets,
    push_disk,
    push_distributed,
    push_tensor,
)


def FakeEngine(**kw) -> ModelledSGLang:  # noqa: N802 - SGLang's state machine, modelled
    return ModelledSGLang(**kw)


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 7
    return t


@pytest.fixture(autouse=True)
def _fresh_group(trainer):
    """Each test's engines are new: the trainer joins them in a new NCCL group."""
    trainer._weight_group = None


def test_disk_push_posts_path_and_checks_version(trainer, tmp_path):
    engine = FakeEngine()
    out = push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path),
                    transport=httpx.MockTransport(engine))
    assert out == {"http://e1": "7"}
    (path, body), (verify, _) = engine.requests
    assert path == "/update_weights_from_disk" and verify == "/model_info"
    assert body["weight_version"] == "7" and body["model_path"].endswith("/v7")
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(body["model_path"]).hidden_size == 64


def test_disk_push_refused_or_wrong_version_is_an_error(trainer, tmp_path):
    refusing = FakeEngine(refuse={"/update_weights_from_disk": "nope"})
    with pytest.raises(WeightPushError,
                       match=r"http://e1 refused POST /update_weights_from_disk \(HTTP 400\): nope"):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path),
                  transport=httpx.MockTransport(refusing))
    with pytest.raises(WeightPushError, match="reports weight version '0'.*trainer is at 7"):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path),
                  transport=httpx.MockTransport(FakeEngine(lie=True)))


def test_buckets_respect_byte_budget():
    named = [(f"p{i}", torch.zeros(10)) for i in range(5)]  # 40 bytes each
    sizes = [len(b) for b in buckets(iter(named), 100)]
    assert sizes == [2, 2, 1]


def test_distributed_push_requests_and_broadcasts(trainer):
    nccl = FakeNCCL(receivers=2)
    engines = {"http://a": FakeEngine(nccl=nccl), "http://b": FakeEngine(nccl=nccl)}
    groups = []
    out = push_distributed(
        trainer, [{"url": "http://a", "tp_size": 2}, {"url": "http://b", "tp_size": 1}],
        master_address="10.0.0.1", master_port=29555, bucket_bytes=4 << 20,
        transport=transport(engines),
        init_group=lambda addr, port, world, name: groups.append((addr, port, world, name)) or "G",
        broadcast=nccl.broadcast, timeout=30,
    )
    assert out == {"http://a": "7", "http://b": "7"}
    assert groups == [("10.0.0.1", 29555, 4, "spade_weight_update_0")]
    a, b = engines.values()
    inits = [body for e in (a, b) for p, body in e.requests if p == "/init_weights_update_group"]
    assert [x["rank_offset"] for x in inits] == [1, 3] and {x["world_size"] for x in inits} == {4}
    # SGLang's order: group, session open, buckets, session closed; nothing refused
    n = len([p for p in a.paths if p == "/update_weights_from_distributed"])
    assert a.paths == (["/init_weights_update_group", "/begin_weight_update"]
                       + ["/update_weights_from_distributed"] * n
                       + ["/end_weight_update", "/model_info"])
    assert not a.refused() and not b.refused() and a.state.session is None
    updates = [x for p, x in a.requests if p == "/update_weights_from_distributed"]
    names = [nm for x in updates for nm in x["names"]]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied
    assert len(updates) >= 2  # 12.6 MB embedding > one 4 MB bucket
    assert [x["flush_cache"] for x in updates] == [False] * (len(updates) - 1) + [True]
    # an fp32 checkpoint is served in float16 by SGLang's --dtype auto: sent as such
    assert updates[0]["dtypes"][0] == "float16" and all(x["weight_version"] == "7" for x in updates)
    # flattened_bucket: one uint8 broadcast per bucket, its bytes = the bucket's tensors
    assert {x["load_format"] for x in updates} == {"flattened_bucket"}
    assert len(nccl.sent) == len(updates)
    for x, flat in zip(updates, nccl.sent, strict=True):
        sizes = [torch.Size(sh).numel() * 2 for sh in x["shapes"]]  # float16
        assert flat.dtype == torch.uint8 and flat.numel() == sum(sizes)


def test_tensor_push_sends_one_payload_per_tp_rank(trainer):
    engine = FakeEngine()
    out = push_tensor(trainer, [{"url": "http://c", "tp_size": 2}], bucket_bytes=64 << 20,
                      transport=httpx.MockTransport(engine),
                      serialize=lambda chunk: ",".join(n for n, _ in chunk))
    assert out == {"http://c": "7"}
    assert engine.paths == ["/begin_weight_update", "/update_weights_from_tensor",
                            "/end_weight_update", "/model_info"]
    assert not engine.refused()
    path, body = engine.requests[1]
    assert body["flush_cache"] is True
    payloads = body["serialized_named_tensors"]
    assert len(payloads) == 2 and "model.norm.weight" in payloads[0]


def test_disk_push_pauses_only_around_the_update(trainer, tmp_path):
    """Export first (engines keep generating), then pause -> update (KV kept in place, so no
    cache flush) -> continue, then verify."""
    engine = FakeEngine()
    stats = {}
    push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path), pause_mode="in_place",
              stats=stats, transport=httpx.MockTransport(engine))
    paths = [p for p, _ in engine.requests]
    assert paths == ["/pause_generation", "/update_weights_from_disk", "/continue_generation",
                     "/model_info"]
    assert engine.requests[0][1] == {"mode": "in_place"}
    assert engine.requests[1][1]["flush_cache"] is False
    assert stats["paused_s"] > 0


def test_refused_update_still_continues_generation(trainer, tmp_path):
    engine = FakeEngine(refuse={"/update_weights_from_disk": "nope"})
    with pytest.raises(WeightPushError):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path), pause_mode="abort",
                  transport=httpx.MockTransport(engine))
    assert engine.paths[-1] == "/continue_generation" and engine.state.paused is None


def test_distributed_push_in_place_never_flushes_and_streams_buckets(trainer):
    nccl = FakeNCCL(receivers=1)
    engine = FakeEngine(nccl=nccl)
    engine.state.running = 3  # requests in the running batch: kept there by in_place
    push_distributed(
        trainer, [{"url": "http://a", "tp_size": 1}], master_address="10.0.0.1",
        master_port=29555, bucket_bytes=4 << 20, transport=httpx.MockTransport(engine),
        init_group=lambda *a: "G", broadcast=nccl.broadcast, pause_mode="in_place",
    )
    paths = engine.paths
    assert paths[:3] == ["/init_weights_update_group", "/pause_generation",
                         "/begin_weight_update"]
    assert paths[-3:] == ["/end_weight_update",
                                                              "/continue_generation",
                                                              "/model_info"]
    assert not engine.refused()  # a flush would have been refused (running requests)
    updates = [b for p, b in engine.requests if p == "/update_weights_from_distributed"]
    assert len(updates) >= 2 and not any(b["flush_cache"] for b in updates)
