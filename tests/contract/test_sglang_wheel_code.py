"""The project's payloads through SGLang's own code (the pinned wheel's source, run on CPU:
``sglang_wheel.py``): the CUDA-IPC reductions, its safe unpickler, the flattened bucket."""

from __future__ import annotations

import base64
import io
import pickle
import types

import pytest
import torch
from sglang_fake import FakeNCCL, ModelledSGLang, transport
from sglang_wheel import sglang_modules
from torch.multiprocessing import reductions

from spade_async.trainer import ipc
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import push_distributed


def _uuid(physical: int) -> str:
    return f"GPU-5f3c{physical:02d}aa-uuid"


class _Globals(pickle.Unpickler):
    """Every global a pickle names (nothing is called)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.seen: set[tuple[str, str]] = set()

    def find_class(self, module, name):
        self.seen.add((module, name))
        return lambda *a, **k: None


def test_ipc_payload_carries_device_uuids_that_sglang_maps_back(monkeypatch):
    """Bug 3. The trainer rank on physical GPU 5 serialises a CUDA handle; engine 1 of the
    layout [[0-3],[4-7]] sees GPUs 4-7 as devices 0-3. With SGLang's reductions the handle
    carries GPU 5's UUID and SGLang's rebuild maps it to device 1; a plain reduction would
    carry index 5 (no such device there). Torch's CUDA branch of ``reduce_tensor`` is
    stood in for (argument 6 = the device index, as ``_REDUCE_TENSOR_ARG_DEVICE_INDEX``)."""
    visible = list(range(8))  # the trainer process sees every GPU
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid=_uuid(visible[d]))
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    with sglang_modules() as sgl:

        def cuda_reduce(tensor):  # torch's reduce_tensor for a CUDA storage, device index 5
            args = (type(tensor), tensor.size(), tensor.stride(), 0, torch.UntypedStorage,
                    tensor.dtype, 5, b"ipc-handle", 64, 0, False, b"ref", 0, b"event", False)  # fmt: skip
            return reductions.rebuild_cuda_tensor, args

        reductions.reduce_tensor = cuda_reduce
        reductions.init_reductions()
        payload = ipc._sglang_serialize([("model.norm.weight", torch.ones(4))])
        raw = base64.b64decode(payload)
        names = _Globals(raw)
        names.load()
        assert ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified") in names.seen
        assert names.seen <= sgl.SafeUnpickler.ALLOWED_GLOBALS, (
            names.seen - sgl.SafeUnpickler.ALLOWED_GLOBALS
        )
        assert _uuid(5).encode() in raw  # the device slot: GPU 5's UUID, not the index 5
        # the engine's scheduler: SGLang patches too, then its SafeUnpickler rebuilds
        visible[:] = [4, 5, 6, 7]
        rebuilt = []
        reductions._rebuild_cuda_tensor_original = lambda *a: rebuilt.append(a[6]) or "t"
        assert sgl.MultiprocessingSerializer.deserialize(payload) == [("model.norm.weight", "t")]
        assert rebuilt == [1]


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 4
    return t


def test_nccl_buckets_are_what_sglangs_flattened_bucket_receives(trainer):
    """Item 7. Each bucket is one uint8 broadcast; SGLang's receiver allocates
    ``FlattenedTensorBucket.empty(names, dtypes, shapes)``, receives into it and
    ``reconstruct_tensors()``: the trainer's tensors must come out, names and values."""
    nccl = FakeNCCL(receivers=1)
    engine = ModelledSGLang(nccl=nccl)
    push_distributed(
        trainer, [{"url": "http://a", "tp_size": 1}], master_address="127.0.0.1",
        master_port=1, bucket_bytes=4 << 20, transport=transport({"http://a": engine}),
        init_group=lambda *a: "G", broadcast=nccl.broadcast, timeout=30,
    )  # fmt: skip
    assert not engine.refused()
    updates = [b for p, b in engine.requests if p == "/update_weights_from_distributed"]
    params = {n: p.detach() for n, p in trainer.model.named_parameters()}
    got = {}
    with sglang_modules() as sgl:
        for body, flat in zip(updates, nccl.sent, strict=True):
            bucket = sgl.tensor_bucket.FlattenedTensorBucket.empty(
                body["names"], body["dtypes"], body["shapes"], "cpu"
            )
            bucket.get_flattened_tensor().copy_(flat)  # the broadcast lands here
            got.update(dict(bucket.reconstruct_tensors()))
    assert len(got) == sum(len(b["names"]) for b in updates) > 2
    for name, t in got.items():
        want = next(p for n, p in params.items() if n.endswith(name) or name.endswith(n))
        assert t.dtype == torch.float16 and t.shape == want.shape
        # the fp32 weights cast to float16 once: equal to that cast bit for bit
        assert torch.equal(t, want.to(torch.float16)), name
