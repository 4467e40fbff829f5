"""Colocated CUDA-IPC push: each SGLang TP rank gets its own payload, from the trainer rank
on its GPU (ipc.py). Two trainer ranks are simulated by threads with fake collectives; the
serializer is a fake (SGLang's MultiprocessingSerializer needs CUDA tensors)."""

from __future__ import annotations

import itertools
import threading
import types

import httpx
import pytest
import torch
from sglang_fake import ModelledSGLang

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.ipc import push_tensor, tp_assignment
from spade_async.trainer.weights import WeightPushError, engine_target


@pytest.fixture(scope="module")
def base(tiny_model):
    from spade_async.trainer.step import Trainer

    return Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)


def test_assignment_prefers_the_rank_on_the_same_gpu():
    # engine 0: TP ranks on GPUs 5, 4; engine 1 on GPU 6, where no trainer rank runs
    got = tp_assignment([[5, 4], [6]], rank_gpus=[4, 5])
    assert got == {(0, 0): 1, (0, 1): 0, (1, 0): 0}


def test_engine_targets_parse():
    assert engine_target("http://a") == {"url": "http://a", "tp_size": 1}
    assert engine_target("http://a#tp=2;gpus=4,5") == {
        "url": "http://a", "tp_size": 2, "gpus": [4, 5]}
    with pytest.raises(WeightPushError, match="unknown field 'pp'"):
        engine_target("http://a#pp=2")


class Ranks:
    """Fake gather/all-gather for N threads (one per trainer rank)."""

    def __init__(self, n: int) -> None:
        self.n, self.slots = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=30)

    def collectives(self, rank: int):
        def all_gather(obj):
            self.barrier.wait()
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out

        def gather(obj):
            out = all_gather(obj)
            return out if rank == 0 else None

        return gather, all_gather


def _run_two_ranks(base, engines, handler, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    ranks, counter = Ranks(2), itertools.count()
    results, errors = [None, None], [None, None]

    def rank_main(r: int) -> None:
        view = types.SimpleNamespace(
            rank=r, world=2, distributed=True, device=torch.device("cuda", r),
            model=base.model, model_dir=base.model_dir, version=9)
        try:
            results[r] = push_tensor(
                view, engines, bucket_bytes=4 << 20, transport=httpx.MockTransport(handler),
                serialize=lambda chunk: f"r{r}#{next(counter)}:{len(chunk)}",
                collectives=ranks.collectives(r), dtype="bfloat16")
        except Exception as exc:  # noqa: BLE001 - reported to the test below
            errors[r] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results, errors


def test_each_tp_rank_gets_its_own_payload_from_its_gpu(base, monkeypatch):
    fakes = {"c": ModelledSGLang(), "d": ModelledSGLang()}  # SGLang's state machine

    def handler(request: httpx.Request) -> httpx.Response:
        return fakes[request.url.host](request)

    engines = [{"url": "http://c", "tp_size": 2, "gpus": [5, 4]},
               {"url": "http://d", "tp_size": 1, "gpus": [6]}]
    results, errors = _run_two_ranks(base, engines, handler, monkeypatch)
    assert errors == [None, None]
    assert results == [{"http://c": "9", "http://d": "9"}, {}]
    assert not fakes["c"].refused() and not fakes["d"].refused()
    posted = [(h, b) for h, f in fakes.items() for p, b in f.requests
              if p == "/update_weights_from_tensor"]  # fmt: skip
    c = [b["serialized_named_tensors"] for host, b in posted if host == "c"]
    d = [b["serialized_named_tensors"] for host, b in posted if host == "d"]
    assert len(c) == len(d) >= 2  # several buckets
    for lst in c:  # TP rank 0 sits on GPU 5 = trainer rank 1; TP rank 1 on GPU 4 = rank 0
        assert lst[0].startswith("r1#") and lst[1].startswith("r0#")
    assert all(len(lst) == 1 and lst[0].startswith("r0#") for lst in d)
    every = [p for lst in c + d for p in lst]
    assert len(set(every)) == len(every)  # one serialisation per TP rank, never shared
    flush = [b["flush_cache"] for host, b in posted if host == "c"]
    assert flush == [False] * (len(flush) - 1) + [True]


def test_refused_bucket_stops_every_rank(base, monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"success": False, "message": "bad shapes"})

    engines = [{"url": "http://c", "tp_size": 2, "gpus": [4, 5]}]
    results, errors = _run_two_ranks(base, engines, handler, monkeypatch)
    assert isinstance(errors[0], WeightPushError) and "bad shapes" in str(errors[0])
    assert errors[1] is None and results[1] == {}
