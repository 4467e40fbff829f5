"""After a weight push no new request reuses KV cache computed with older weights: the
async schedule's default pause mode is one SGLang lets flush (``retract``), and every push
path then asks for the flush."""

from __future__ import annotations

import httpx
import pytest

from spade_async.loop.config import PipelineConfig
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import push_disk, push_distributed, push_tensor


def test_default_pause_mode_lets_sglang_flush():
    # SGLang 0.5.23 PauseGenerationReqInput: in_place keeps the KV cache and a flush fails;
    # retract requeues running requests and their KV cache is recomputed after continue.
    assert PipelineConfig().pause_mode == "retract"


class _Engine:
    def __init__(self) -> None:
        self.bodies: dict[str, list[dict]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content) if request.content else {}
        self.bodies.setdefault(request.url.path, []).append(body)
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "/m", "weight_version": "7"})
        return httpx.Response(200, json={"success": True, "message": "ok"})


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 7
    return t


def test_every_push_path_flushes_under_the_default_pause(trainer, tmp_path):
    mode = PipelineConfig().pause_mode
    engine = _Engine()
    transport = httpx.MockTransport(engine)
    push_disk(trainer, ["http://e"], shm_dir=str(tmp_path), pause_mode=mode, transport=transport)
    push_tensor(trainer, [{"url": "http://e", "tp_size": 1}], bucket_bytes=64 << 20,
                pause_mode=mode, transport=transport, serialize=lambda chunk: "x")
    push_distributed(trainer, [{"url": "http://e", "tp_size": 1}], master_address="h",
                     master_port=1, bucket_bytes=64 << 20, pause_mode=mode, transport=transport,
                     init_group=lambda *a: "G", broadcast=lambda t, g: None)
    assert all(b == {"mode": "retract"} for b in engine.bodies["/pause_generation"])
    disk = engine.bodies["/update_weights_from_disk"]
    assert all(b.get("flush_cache", True) for b in disk)  # SGLang's default is True
    for path in ("/update_weights_from_tensor", "/update_weights_from_distributed"):
        assert engine.bodies[path][-1]["flush_cache"] is True  # the last bucket flushes
