"""Contract tests of the weight-push requests (fake HTTP transport, fake NCCL/IPC)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import (
    WeightPushError,
    buckets,
    push_disk,
    push_distributed,
    push_tensor,
)


class FakeEngine:
    """Records requests; reports whatever weight_version the last update carried."""

    def __init__(self, *, refuse: bool = False, lie: bool = False) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.version = "0"
        self.refuse, self.lie = refuse, lie

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/model_info":
            return httpx.Response(200, json={"weight_version": self.version})
        if self.refuse:
            return httpx.Response(400, json={"success": False, "message": "nope"})
        if "weight_version" in body and not self.lie:
            self.version = body["weight_version"]
        return httpx.Response(200, json={"success": True, "message": "ok"})


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 7
    return t


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
    with pytest.raises(WeightPushError, match="refused the weight update"):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path),
                  transport=httpx.MockTransport(FakeEngine(refuse=True)))
    with pytest.raises(WeightPushError, match="reports weight version '0'.*trainer is at 7"):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path),
                  transport=httpx.MockTransport(FakeEngine(lie=True)))


def test_buckets_respect_byte_budget():
    named = [(f"p{i}", torch.zeros(10)) for i in range(5)]  # 40 bytes each
    sizes = [len(b) for b in buckets(iter(named), 100)]
    assert sizes == [2, 2, 1]


def test_distributed_push_requests_and_broadcasts(trainer):
    engines = [FakeEngine(), FakeEngine()]
    routes = {"http://a": engines[0], "http://b": engines[1]}
    transport = httpx.MockTransport(lambda r: routes[f"http://{r.url.host}"](r))
    groups, sent = [], []
    out = push_distributed(
        trainer, [{"url": "http://a", "tp_size": 2}, {"url": "http://b", "tp_size": 1}],
        master_address="10.0.0.1", master_port=29555, bucket_bytes=4 << 20, transport=transport,
        init_group=lambda addr, port, world, name: groups.append((addr, port, world, name)) or "G",
        broadcast=lambda t, g: sent.append((tuple(t.shape), g)),
    )
    assert out == {"http://a": "7", "http://b": "7"}
    assert groups == [("10.0.0.1", 29555, 4, "spade_weight_update_0")]
    inits = [b for e in engines for p, b in e.requests if p == "/init_weights_update_group"]
    assert [b["rank_offset"] for b in inits] == [1, 3] and {b["world_size"] for b in inits} == {4}
    updates = [b for p, b in engines[0].requests if p == "/update_weights_from_distributed"]
    names = [n for b in updates for n in b["names"]]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied
    assert len(names) == len(sent) and len(updates) >= 2  # 12.6 MB embedding > one 4 MB bucket
    assert [b["flush_cache"] for b in updates] == [False] * (len(updates) - 1) + [True]
    # an fp32 checkpoint is served in float16 by SGLang's --dtype auto: sent as such
    assert updates[0]["dtypes"][0] == "float16" and all(b["weight_version"] == "7" for b in updates)
    shapes = [s for b in updates for s in b["shapes"]]
    assert [list(s) for s, _ in sent] == shapes and all(g == "G" for _, g in sent)


def test_tensor_push_sends_one_payload_per_tp_rank(trainer):
    engine = FakeEngine()
    out = push_tensor(trainer, [{"url": "http://c", "tp_size": 2}], bucket_bytes=64 << 20,
                      transport=httpx.MockTransport(engine),
                      serialize=lambda chunk: ",".join(n for n, _ in chunk))
    assert out == {"http://c": "7"}
    (path, body), _ = engine.requests
    assert path == "/update_weights_from_tensor" and body["flush_cache"] is True
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
    engine = FakeEngine()
    with pytest.raises(WeightPushError):
        push_disk(trainer, ["http://e1"], shm_dir=str(tmp_path), pause_mode="abort",
                  transport=httpx.MockTransport(lambda r: _refuse_update(engine, r)))
    assert [p for p, _ in engine.requests][-1] == "/continue_generation"


def _refuse_update(engine: FakeEngine, request: httpx.Request) -> httpx.Response:
    engine.requests.append((request.url.path, {}))
    if request.url.path == "/update_weights_from_disk":
        return httpx.Response(400, json={"success": False, "message": "nope"})
    return httpx.Response(200, json={"success": True})


def test_distributed_push_in_place_never_flushes_and_streams_buckets(trainer):
    engine = FakeEngine()
    sent = []
    push_distributed(
        trainer, [{"url": "http://a", "tp_size": 1}], master_address="10.0.0.1",
        master_port=29555, bucket_bytes=4 << 20, transport=httpx.MockTransport(engine),
        init_group=lambda *a: "G", broadcast=lambda t, g: sent.append(t.shape),
        pause_mode="in_place",
    )
    paths = [p for p, _ in engine.requests]
    assert paths[0] == "/pause_generation" and paths[-2:] == ["/continue_generation",
                                                              "/model_info"]
    updates = [b for p, b in engine.requests if p == "/update_weights_from_distributed"]
    assert len(updates) >= 2 and not any(b["flush_cache"] for b in updates)
