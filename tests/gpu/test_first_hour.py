"""The first hour on a real node: ``make test-gpu`` (pytest -v: one line per check).

One SGLang 0.5.23 server on a small model (the suite's tiny Qwen-shaped checkpoint; pass
``SPADE_FIRST_HOUR_MODEL=/models/Qwen3-0.6B`` for a real one), driven through the
project's own code paths, in the order a training run uses them. Every check skips cleanly
without CUDA or without SGLang installed. Not run on a GPU while this was written (SGLang
cannot be installed on the development machines): a failure here is news, please report
it with the server log (``$TMPDIR/.../sglang.log``, printed on failure).
"""

from __future__ import annotations

import os
import socket
import time

import anyio
import httpx
import pytest

from spade_async.generation.client import ClientConfig, GenerationClient
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.sglang import SGLangConfig, SGLangServer
from spade_async.generation.sglang_state import MEMORY_TAGS

pytestmark = pytest.mark.gpu

IDS = [1, 2, 3, 4]
SP = SamplingParams(max_new_tokens=8, temperature=0.0)


def _needs_gpu(n: int = 1):
    pytest.importorskip("sglang", reason="SGLang is not installed (pip install -e '.[gpu]')")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPU(s)")
    return torch


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return os.environ.get("SPADE_FIRST_HOUR_MODEL") or str(tiny_model)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """One server on GPU 0 with the memory saver (release/resume) on."""
    _needs_gpu()
    log = tmp_path_factory.mktemp("sglang") / "sglang.log"
    cfg = SGLangConfig(model_path=model_dir, gpu_ids=[0], port=_port(), mem_fraction_static=0.3,
                       extra_args=["--enable-memory-saver"], log_path=str(log))  # fmt: skip
    portal_cm = anyio.from_thread.start_blocking_portal()
    portal = portal_cm.__enter__()
    srv = SGLangServer(cfg)
    try:
        portal.call(srv.start)
    except Exception:
        print(log.read_text()[-4000:] if log.exists() else "no log")
        raise
    yield srv
    portal.call(srv.stop)
    portal_cm.__exit__(None, None, None)


def _client_run(server, fn):
    async def main():
        async with GenerationClient([server.url], ClientConfig(max_retries=0)) as client:
            return await fn(client)

    return anyio.run(main)


def test_generate(server):
    async def go(client):
        return await client.generate(IDS, SP)

    res = _client_run(server, go)
    assert len(res.output_ids) == 8 and len(res.logprobs) == 8


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_pause_mode_then_disk_push(server, model_dir, mode):
    """Each pause mode around a disk push (in_place: no flush, SGLang refuses one then)."""

    async def go(client):
        before = (await client.weight_versions())[server.url]
        version = f"{before}-{mode}"
        await client.pause(mode)
        out = await client.update_weights_from_disk(
            model_dir, weight_version=version, flush_cache=mode != "in_place"
        )
        await client.resume()
        res = await client.generate(IDS, SP)
        return version, out, res

    version, out, res = _client_run(server, go)
    assert out == {server.url: version} and res.weight_version == version


def test_health_stays_200_during_a_paused_push(server):
    """The launcher sets SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0: /health is liveness."""
    httpx.post(f"{server.url}/pause_generation", json={"mode": "in_place"}, timeout=30)
    try:
        t0 = time.monotonic()
        status = httpx.get(f"{server.url}/health", timeout=30).status_code
        took = time.monotonic() - t0
    finally:
        httpx.post(f"{server.url}/continue_generation", json={}, timeout=30)
    assert status == 200 and took < 5, (status, took)


def test_release_and_resume_memory(server, model_dir):
    async def go(client):
        await client.release_memory(list(MEMORY_TAGS))
        await client.resume_memory(["weights"])
        await client.update_weights_from_disk(model_dir, weight_version="released")
        await client.resume_memory([t for t in MEMORY_TAGS if t != "weights"])
        return await client.generate(IDS, SP)

    assert _client_run(server, go).weight_version == "released"


def _trainer(model_dir, device):
    from spade_async.trainer.config import TrainerConfig
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=model_dir), model_dir, device=device)
    t.version = 11
    return t


def test_ipc_push_on_the_same_gpu(server, model_dir):
    """CUDA IPC (colocated): begin -> update_weights_from_tensor -> end, SGLang's reductions."""
    torch = _needs_gpu()
    from spade_async.trainer.ipc import push_tensor

    trainer = _trainer(model_dir, torch.device("cuda", 0))
    out = push_tensor(trainer, [{"url": server.url, "tp_size": 1, "gpus": [0]}],
                      bucket_bytes=64 << 20, timeout=120)  # fmt: skip
    assert out == {server.url: "11"}


def test_nccl_push_from_a_trainer_rank(model_dir, tmp_path):
    """NCCL (disaggregated): a second server on GPU 1, the trainer on GPU 0: init group ->
    begin -> flattened_bucket broadcasts -> end."""
    torch = _needs_gpu(2)
    from spade_async.trainer.weights import push_distributed

    cfg = SGLangConfig(model_path=model_dir, gpu_ids=[1], port=_port(), mem_fraction_static=0.3,
                       log_path=str(tmp_path / "sglang-nccl.log"))  # fmt: skip
    trainer = _trainer(model_dir, torch.device("cuda", 0))

    async def main():
        async with SGLangServer(cfg) as srv:
            return srv.url, await anyio.to_thread.run_sync(
                lambda: push_distributed(
                    trainer, [{"url": srv.url, "tp_size": 1}], master_address="127.0.0.1",
                    master_port=_port(), bucket_bytes=64 << 20, timeout=300,
                )  # fmt: skip
            )

    url, out = anyio.run(main)
    assert out == {url: "11"}
