"""The weight push against SGLang 0.5.23's state machine (tests/sglang_fake.py keeps it):
sessions around NCCL/IPC updates, every paused engine continued, refusals as one error."""

from __future__ import annotations

import time

import pytest
from sglang_fake import FakeNCCL, ModelledSGLang, transport

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import WeightPushError, push_disk, push_distributed, push_tensor

URLS = ["http://a", "http://b", "http://c"]


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 3
    return t


@pytest.fixture(autouse=True)
def _fresh_group(trainer):
    trainer._weight_group = None


def _distributed(trainer, engines, nccl, **kw):
    return push_distributed(
        trainer, [{"url": u, "tp_size": 1} for u in engines], master_address="127.0.0.1",
        master_port=1, bucket_bytes=8 << 20, transport=transport(engines),
        init_group=lambda *a: "G", broadcast=nccl.broadcast, **kw,
    )  # fmt: skip


def _tensor(trainer, engines, **kw):
    return push_tensor(
        trainer, [{"url": u, "tp_size": 1} for u in engines], bucket_bytes=8 << 20,
        transport=transport(engines), serialize=lambda chunk: "payload", **kw,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["distributed", "tensor"])
def test_nccl_and_ipc_pushes_run_inside_a_weight_update_session(trainer, mode):
    """Bug 1: SGLang refuses both updates outside begin/end_weight_update."""
    nccl = FakeNCCL(receivers=2)
    engines = {u: ModelledSGLang(nccl=nccl) for u in URLS[:2]}
    if mode == "distributed":
        out = _distributed(trainer, engines, nccl, timeout=20)
    else:
        out = _tensor(trainer, engines)
    assert out == dict.fromkeys(URLS[:2], "3")
    for e in engines.values():
        assert not e.refused(), e.refused()
        assert e.state.session is None and e.state.weight_version == "3"
        assert e.paths.index("/begin_weight_update") < e.paths.index(f"/update_weights_from_{mode}")


def test_a_refused_nccl_bucket_is_one_error_and_no_hang(trainer):
    """An engine that refuses never joins the broadcast: the push ends at once with one
    error naming engine, route and SGLang's message; every engine is continued and its
    session closed."""
    nccl = FakeNCCL(receivers=2, timeout_s=30)
    lost = "Failed to receive weights: Group spade_weight_update_0 not in []"
    engines = {
        "http://a": ModelledSGLang(nccl=nccl),
        "http://b": ModelledSGLang(nccl=nccl, refuse={"/update_weights_from_distributed": lost}),
    }
    t0 = time.monotonic()
    with pytest.raises(WeightPushError) as err:
        _distributed(trainer, engines, nccl, pause_mode="retract", timeout=20)
    assert time.monotonic() - t0 < 15  # not the 30 s the unjoined broadcast would wait
    msg = str(err.value)
    assert "http://b refused POST /update_weights_from_distributed (HTTP 400)" in msg
    assert lost in msg and msg.count("refused") == 1
    for e in engines.values():
        assert e.state.paused is None and e.state.session is None
        assert e.paths[-1] == "/continue_generation"


def test_nccl_push_times_out_instead_of_hanging(trainer):
    """An engine that never answers (and never joins): push_timeout_s ends the push."""
    nccl = FakeNCCL(receivers=2, timeout_s=30)
    engines = {u: ModelledSGLang(nccl=nccl) for u in URLS[:1]}
    nccl.receivers = 2  # a second receiver that never comes
    t0 = time.monotonic()
    with pytest.raises(WeightPushError, match="within push_timeout_s"):
        _distributed(trainer, engines, nccl, timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert engines["http://a"].state.session is None


def test_a_refused_pause_continues_every_engine_already_paused(trainer, tmp_path):
    """Bug 5: engine b refuses its pause: a (paused before it) and b are continued."""
    engines = {u: ModelledSGLang() for u in URLS}
    engines["http://b"].refuse["/pause_generation"] = "busy"
    with pytest.raises(WeightPushError, match=r"http://b refused POST /pause_generation"):
        push_disk(trainer, URLS, shm_dir=str(tmp_path), pause_mode="in_place",
                  transport=transport(engines))  # fmt: skip
    assert engines["http://a"].state.paused is None
    assert engines["http://a"].paths == ["/pause_generation", "/continue_generation"]
    assert engines["http://b"].paths[-1] == "/continue_generation"
    assert "/pause_generation" not in engines["http://c"].paths  # never paused


def test_a_refused_continue_is_an_error_not_swallowed(trainer, tmp_path):
    """Bug 5: a continue that fails leaves an engine paused: the push says so, naming it,
    after continuing the others."""
    engines = {u: ModelledSGLang() for u in URLS}
    engines["http://c"].refuse["/continue_generation"] = "scheduler gone"
    with pytest.raises(WeightPushError,
                       match=r"http://c refused POST /continue_generation.*scheduler gone"):
        push_disk(trainer, URLS, shm_dir=str(tmp_path), pause_mode="retract",
                  transport=transport(engines))  # fmt: skip
    assert all(engines[u].state.paused is None for u in URLS[:2])
    assert all(engines[u].state.weight_version == "3" for u in URLS)


def test_push_after_a_trainer_killed_mid_push_closes_the_stale_session(trainer):
    """The dead trainer left a session open: SGLang refuses a second begin; the restarted
    trainer's push closes it and opens its own."""
    nccl = FakeNCCL(receivers=1)
    engines = {"http://a": ModelledSGLang(nccl=nccl)}
    engines["http://a"].state.begin_weight_update()  # the killed push's session
    assert _distributed(trainer, engines, nccl, timeout=20) == {"http://a": "3"}
    e = engines["http://a"]
    assert e.paths[1:4] == ["/begin_weight_update", "/end_weight_update", "/begin_weight_update"]
    assert [c.path for c in e.refused()] == ["/begin_weight_update"]  # the stale one, once
    assert e.state.session is None


def test_in_place_pause_with_a_flush_fails_the_update(trainer, tmp_path):
    """The state machine: a flush after an update is refused while requests stay in the
    running batch (in_place), and the update is reported as failed (the push never asks)."""
    e = ModelledSGLang()
    e.state.running = 2
    e.state.pause_generation("in_place")
    v = e.state.update_weights_from_disk("9", flush_cache=True)
    assert not v.ok and "cache was not flushed" in v.message
    assert e.state.served_version == "9" and e.state.weight_version == "0"
    # the project's in_place push sends flush_cache=false: accepted
    e.state.continue_generation()
    push_disk(trainer, ["http://a"], shm_dir=str(tmp_path), pause_mode="in_place",
              transport=transport({"http://a": e}))  # fmt: skip
    assert not e.refused() and e.state.weight_version == "3"
