"""The NCCL weight group across restarts (group.py), checked against the requests SGLang
0.5.23 serves (init/destroy_weights_update_group, update_weights_from_distributed). The
NCCL group itself is a fake here: contract-tested, not run on a GPU."""

from __future__ import annotations

import json
import types

import anyio
import httpx
import pytest

from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import push_distributed


class Engine:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.groups: set[str] = set()
        self.version = "0"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, body = request.url.path, json.loads(request.content or b"{}")
        self.requests.append((path, body))
        if path == "/model_info":
            return httpx.Response(200, json={"weight_version": self.version})
        if path == "/init_weights_update_group":
            if body["group_name"] in self.groups:  # what a name clash would do
                return httpx.Response(400, json={"success": False, "message": "exists"})
            self.groups.add(body["group_name"])
        elif path == "/destroy_weights_update_group":
            if body["group_name"] not in self.groups:
                return httpx.Response(400, json={"success": False, "message": "no such group"})
            self.groups.discard(body["group_name"])
        elif path == "/update_weights_from_distributed":
            assert body["group_name"] in self.groups, body["group_name"]
            self.version = body["weight_version"]
        return httpx.Response(200, json={"success": True, "message": ""})


@pytest.fixture(scope="module")
def base(tiny_model):
    from spade_async.trainer.step import Trainer

    return Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)


def _trainer(base, version: int):
    """A trainer rank 0 (a fresh object = a restarted trainer process)."""
    return types.SimpleNamespace(rank=0, model=base.model, model_dir=base.model_dir,
                                 version=version)


def _push(trainer, engine, epoch, previous, log):
    return push_distributed(
        trainer, [{"url": "http://e", "tp_size": 2}], master_address="127.0.0.1",
        master_port=29600 + epoch, bucket_bytes=64 << 20, transport=httpx.MockTransport(engine),
        init_group=lambda addr, port, world, name: log.append(("init", port, world, name))
        or f"G{epoch}",
        destroy_group=lambda g: log.append(("destroy", g)),
        broadcast=lambda t, g: None, group_epoch=epoch, previous_group_epoch=previous,
    )


def test_group_is_made_once_then_renewed_after_an_engine_restart(base):
    engine, log, t = Engine(), [], _trainer(base, 1)
    assert _push(t, engine, 0, -1, log) == {"http://e": "1"}
    t.version = 2
    _push(t, engine, 0, 0, log)  # same epoch: the group is reused
    assert log == [("init", 29600, 3, "spade_weight_update_0")]
    # the engine crashed and came back: it holds no group; epoch 1 on a new port
    restarted = Engine()
    t.version = 3
    assert _push(t, restarted, 1, 0, log) == {"http://e": "3"}
    assert log[1:] == [("destroy", "G0"), ("init", 29601, 3, "spade_weight_update_1")]
    paths = [p for p, _ in restarted.requests]
    assert paths.index("/destroy_weights_update_group") < paths.index(
        "/init_weights_update_group")  # its "no such group" answer is ignored
    assert restarted.groups == {"spade_weight_update_1"}


def test_restarted_trainer_drops_the_old_group_on_surviving_engines(base):
    engine, log = Engine(), []
    _push(_trainer(base, 1), engine, 0, -1, log)
    assert engine.groups == {"spade_weight_update_0"}
    # the trainer died; its successor has no group object, the engine still has epoch 0's
    _push(_trainer(base, 1), engine, 1, 0, log)
    assert engine.groups == {"spade_weight_update_1"}
    assert [e[0] for e in log] == ["init", "init"]  # nothing of the dead trainer to close
    updates = [b for p, b in engine.requests if p == "/update_weights_from_distributed"]
    assert updates[-1]["group_name"] == "spade_weight_update_1"


def test_runtime_numbers_groups_by_restarts():
    """Runtime.push: epoch = trainer restarts + engine restarts, a fresh port on a change,
    and the previous epoch passed on; an engine restart triggers a push at once."""
    from spade_async.loop.runtime import Runtime

    calls = []

    async def push_weights(**kw):
        calls.append(kw)
        return types.SimpleNamespace(version=5)

    engines = [types.SimpleNamespace(restarts=0, url=u) for u in ("u", "v")]
    released = []
    rt = types.SimpleNamespace(
        client=types.SimpleNamespace(release=released.append),
        push_kw={"engines": ["u#tp=1", "v#tp=1"], "mode": "distributed", "master_port": 1},
        engines=engines, trainer_restarts=0, pushed_group_epoch=-1,
        trainer=types.SimpleNamespace(push_weights=push_weights),
        cfg=types.SimpleNamespace(pipeline=types.SimpleNamespace(pause_mode="in_place"),
                                  schedule="async"),
        state=types.SimpleNamespace(version=0),
        adapters=None,  # full-weight pushes (trainer.lora unset)
    )
    rt.push = lambda *, pause: Runtime.push(rt, pause=pause)

    async def main():
        await Runtime.push(rt, pause=False)
        await Runtime.push(rt, pause=False)
        engines[1].restarts = 1
        await Runtime.engine_restarted(rt, engines[1])

    anyio.run(main)
    epochs = [(c["group_epoch"], c["previous_group_epoch"], c["master_port"]) for c in calls]
    assert epochs[:2] == [(0, -1, 1), (0, 0, 1)]
    assert epochs[2][:2] == (1, 0) and epochs[2][2] != 1  # new group, new rendezvous port
    assert calls[2]["pause_mode"] == "in_place" and rt.state.version == 5
    assert released == ["v"]  # back in the client's rotation only after the push
