"""``sglang_state.SGLangState`` (what the CPU engine and every fake enforce) against SGLang
0.5.23's own ``SchedulerWeightUpdaterManager``, run from the wheel's source on CPU around a
stand-in scheduler and model runner (``sglang_wheel.py``): the same calls in the same
order give the same answers (accepted, refused, or the scheduler raising), the same
offload set and session, the same weight version. Random sequences plus planted
mis-orders (a push without a session, a double resume, a resume of all tags after the
weights') that must be refused by both."""

from __future__ import annotations

import random

import pytest
from sglang_wheel import StandIn, request, weight_updater_manager

from spade_async.generation.sglang_state import MEMORY_TAGS, SGLangState

TAG_CHOICES = [None, [], ["weights"], ["kv_cache"], ["cuda_graph"], ["kv_cache", "cuda_graph"],
               ["weights", "kv_cache"], ["gpu"], list(MEMORY_TAGS)]  # fmt: skip


class Pair:
    """One call to both: SGLang's manager and the model."""

    def __init__(self) -> None:
        self.stand_in = StandIn()
        self.wu, self.ns = weight_updater_manager(self.stand_in)
        self.model = SGLangState("0")
        self.model.groups.add("weight_update_group")

    def running(self, n: int) -> None:
        """``n`` requests left in the running batch: only an in_place pause keeps them
        there while a control call runs (unpaused, TM's writer lock waits them out)."""
        self.stand_in.running = self.model.running = n
        self.model.paused = "in_place" if n else None

    def call(self, op: str, **kw) -> tuple[tuple[bool, bool], tuple[bool, bool]]:
        """((ok, raised) of SGLang, (ok, fatal) of the model)."""
        sg = self._sglang(op, kw)
        v = getattr(self.model, op)(**_model_kw(op, kw))
        return sg, (v.ok, v.fatal)

    def _sglang(self, op: str, kw: dict) -> tuple[bool, bool]:
        cls = {
            "begin_weight_update": "BeginWeightUpdateReqInput",
            "end_weight_update": "EndWeightUpdateReqInput",
            "update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
            "update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
            "update_weights_from_disk": "UpdateWeightFromDiskReqInput",
            "release_memory_occupation": "ReleaseMemoryOccupationReqInput",
            "resume_memory_occupation": "ResumeMemoryOccupationReqInput",
        }[op]
        fields = {"serialized_named_tensors": [b"x"], "names": [], "dtypes": [], "shapes": [],
                  "model_path": "/m", **kw}  # fmt: skip
        try:
            out = getattr(self.wu, op)(request(self.ns, cls, **fields))
        except (KeyError, AssertionError):
            return False, True
        return bool(getattr(out, "success", True)), False


def _model_kw(op: str, kw: dict) -> dict:
    if op.startswith("update_weights"):
        out = {
            "weight_version": kw.get("weight_version"),
            "flush_cache": kw.get("flush_cache", True),
        }
        if op.endswith("distributed"):
            out["group_name"] = "weight_update_group"
        return out
    if op.endswith("memory_occupation"):
        return {"tags": kw.get("tags")}
    return {}


def _same_state(p: Pair) -> None:
    assert p.model.offload_tags == p.wu.offload_tags
    assert (p.model.session is None) == (p.wu._session is None)
    assert p.model.served_version == (p.stand_in.weight_version or "0")


def test_random_sequences_agree_with_sglangs_manager():
    rng = random.Random(20)
    ops = ["begin_weight_update", "end_weight_update", "update_weights_from_tensor",
           "update_weights_from_distributed", "update_weights_from_disk",
           "release_memory_occupation", "resume_memory_occupation", "running"]  # fmt: skip
    checked = 0
    for _ in range(300):
        p = Pair()
        for step in range(12):
            op = rng.choice(ops)
            if op == "running":
                p.running(rng.choice([0, 0, 2]))
                continue
            if op.startswith("update") and "weights" in p.model.offload_tags:
                continue  # a device fault on a GPU (unmapped weights), no code to compare
            kw = {}
            if op.endswith("memory_occupation"):
                kw["tags"] = rng.choice(TAG_CHOICES)
            if op.startswith("update"):
                kw = {"weight_version": str(step), "flush_cache": rng.random() < 0.7}
            sg, model = p.call(op, **kw)
            assert sg == model, (op, kw, sg, model)
            checked += 1
            if sg[1]:  # SGLang's scheduler raised: the server is gone
                break
            _same_state(p)
    assert checked > 1000


@pytest.mark.parametrize(
    ("calls", "refused"),
    [
        pytest.param(
            [("update_weights_from_distributed", {})], 0, id="distributed-push-without-session"
        ),
        pytest.param([("update_weights_from_tensor", {})], 0, id="ipc-push-without-session"),
        pytest.param([("end_weight_update", {})], 0, id="end-without-begin"),
        pytest.param(
            [("begin_weight_update", {}), ("begin_weight_update", {})], 1, id="second-begin"
        ),
        pytest.param(
            [
                ("release_memory_occupation", {"tags": ["kv_cache"]}),
                ("resume_memory_occupation", {"tags": ["kv_cache"]}),
                ("resume_memory_occupation", {"tags": ["kv_cache"]}),
            ],
            2,
            id="double-resume",
        ),
        pytest.param(
            [
                ("release_memory_occupation", {"tags": None}),
                ("resume_memory_occupation", {"tags": ["weights"]}),
                ("resume_memory_occupation", {"tags": None}),
            ],
            2,
            id="resume-all-after-weights",
        ),
        pytest.param([("resume_memory_occupation", {"tags": ["gpu"]})], 0, id="unknown-tag"),
    ],
)
def test_planted_misorders_are_refused_by_both(calls, refused):
    p = Pair()
    for i, (op, kw) in enumerate(calls):
        sg, model = p.call(op, **kw)
        assert sg == model
        assert sg[0] is (i != refused), f"{op} #{i}: SGLang says {sg}"


def test_in_place_flush_fails_the_update_in_both():
    p = Pair()
    p.call("begin_weight_update")
    p.running(3)
    sg, model = p.call("update_weights_from_tensor", weight_version="5", flush_cache=True)
    assert sg == model == (False, False)
    assert p.stand_in.weight_version == p.model.served_version == "5"  # weights did change
    sg, model = p.call("update_weights_from_tensor", weight_version="6", flush_cache=False)
    assert sg == model == (True, False)


def test_the_colocated_order_is_legal_in_both():
    """The loop's order (cycle.train_and_push): release all -> resume weights -> push in a
    session -> resume the rest."""
    p = Pair()
    steps = [("release_memory_occupation", {"tags": list(MEMORY_TAGS)}),
             ("resume_memory_occupation", {"tags": ["weights"]}),
             ("begin_weight_update", {}),
             ("update_weights_from_tensor", {"weight_version": "1"}),
             ("end_weight_update", {}),
             ("resume_memory_occupation", {"tags": [t for t in MEMORY_TAGS if t != "weights"]})]  # fmt: skip
    for op, kw in steps:
        assert p.call(op, **kw) == ((True, False), (True, False)), op
    assert not p.wu.offload_tags and p.model.weight_version == "1"
