"""Client failure handling without a model: dead ports, slow engines, engines dying mid-request."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import anyio
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from spade_async.generation.client import (
    ClientConfig,
    EngineError,
    EngineProtocolError,
    EngineRequestError,
    GenerationClient,
)
from spade_async.generation.protocol import SamplingParams

FAST = ClientConfig(max_retries=2, backoff_s=0.05, request_timeout_s=0.5, connect_timeout_s=0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_port_is_retried_then_named():
    url = f"http://127.0.0.1:{_free_port()}"

    async def main():
        async with GenerationClient([url], FAST) as client:
            await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))

    t0 = time.monotonic()
    with pytest.raises(EngineError, match=rf"{url}/generate failed after 3 attempts \(ConnectError"):
        anyio.run(main)
    assert time.monotonic() - t0 >= 0.05 + 0.1  # two backoffs: 0.05 s then 0.1 s


def _serve(app) -> tuple[str, callable]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)

    def stop():
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def test_slow_engine_times_out_every_attempt():
    calls = []

    async def slow(request):
        calls.append(1)
        await anyio.sleep(3)
        return JSONResponse({})

    url, stop = _serve(Starlette(routes=[Route("/generate", slow, methods=["POST"])]))
    try:
        async def main():
            async with GenerationClient([url], FAST) as client:
                await client.generate([1], SamplingParams(max_new_tokens=1))

        with pytest.raises(EngineError, match=rf"{url}/generate failed after 3 attempts"):
            anyio.run(main)
        assert len(calls) == 3
    finally:
        stop()


def test_engine_dying_mid_request_is_retried():
    """A server that accepts and then drops the connection, twice, then answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    reply = (b'{"text": "", "output_ids": [5], "meta_info": {"id": "r", "prompt_tokens": 1, '
             b'"completion_tokens": 1, "finish_reason": {"type": "length", "length": 1}, '
             b'"output_token_logprobs": [[-0.25, 5, null]], "weight_version": "3"}}')

    def serve():
        for attempt in range(3):
            conn, _ = listener.accept()
            conn.recv(65536)
            if attempt < 2:
                conn.close()  # dies mid-request
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(reply)).encode() + b"\r\nconnection: close\r\n\r\n" + reply)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main():
        async with GenerationClient([url], FAST) as client:
            return await client.generate([1], SamplingParams(max_new_tokens=1))

    res = anyio.run(main)
    thread.join(timeout=5)
    listener.close()
    assert res.output_ids == [5] and res.logprobs == [-0.25] and res.weight_version == "3"
    assert res.finish_reason == "length"


def test_sticky_sessions_and_least_loaded_routing():
    client = GenerationClient(["http://a:1", "http://b:1", "http://c:1"])
    client._inflight.update({"http://a:1": 3, "http://b:1": 0, "http://c:1": 1})
    assert client.pick() == "http://b:1"
    assert client.pick("episode-7") == "http://b:1"
    client._inflight["http://b:1"] = 10
    assert client.pick("episode-7") == "http://b:1"  # sticky despite load
    assert client.pick("episode-8") == "http://c:1"
    client._down.add("http://b:1")
    assert client.pick("episode-7") == "http://c:1"  # its engine is down: re-routed
    client.end_session("episode-7")
    assert "episode-7" not in client._sessions
    anyio.run(client.aclose)


def test_bad_model_path_is_one_line_and_exit_2(tmp_path):
    not_lm = tmp_path / "not_a_model"
    not_lm.mkdir()
    (not_lm / "config.json").write_text('{"model_type": "no-such-architecture"}')
    for model in (str(tmp_path / "missing"), str(not_lm)):
        proc = subprocess.run(
            [sys.executable, "-m", "spade_async.generation.server", "--model", model, "--port", "1"],
            capture_output=True, text=True, timeout=120,
        )
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2, proc.stderr
        assert lines[-1].startswith("spade-engine: error: model") and model in lines[-1]


def test_request_bodies_follow_sglang_io_struct():
    """What the client sends, endpoint by endpoint, against SGLang's io_struct field names."""
    seen: dict[str, dict] = {}

    async def record(request):
        body = await request.body()
        seen[request.url.path] = json.loads(body) if body else {}
        if request.url.path == "/generate":
            return JSONResponse({"text": "a", "output_ids": [7], "meta_info": {
                "id": "x", "prompt_tokens": 2, "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "stop", "matched": 7}, "weight_version": "v1",
                "output_token_logprobs": [[-0.5, 7, None]], "e2e_latency": 0.1}})
        if request.url.path == "/model_info":
            return JSONResponse({"model_path": "/m", "tokenizer_path": "/m", "is_generation": True,
                                 "weight_version": "v2", "preferred_sampling_params": None})
        return JSONResponse({"success": True, "message": "ok"})

    paths = ["/generate", "/model_info", "/init_weights_update_group",
             "/update_weights_from_distributed", "/update_weights_from_tensor",
             "/update_weights_from_disk", "/pause_generation", "/continue_generation", "/flush_cache",
             "/release_memory_occupation", "/resume_memory_occupation"]
    url, stop = _serve(Starlette(routes=[Route(p, record, methods=["GET", "POST"]) for p in paths]))
    try:
        async def main():
            async with GenerationClient([url], FAST) as client:
                res = await client.generate(
                    [1, 2], SamplingParams(max_new_tokens=5, temperature=0.6, stop=["</a>"],
                                           stop_token_ids=[2], sampling_seed=3))
                await client.init_weights_update_group("10.0.0.2", 29500, ranks_per_engine=[4])
                v_dist = await client.update_weights_from_distributed(
                    ["w"], ["bfloat16"], [[2, 3]], weight_version="v2")
                await client.update_weights_from_tensor(["b64"], weight_version="v2")
                await client.update_weights_from_disk("/ckpt/step-2", weight_version="v2")
                await client.pause()
                await client.resume()
                await client.flush_cache()
                await client.release_memory()
                await client.resume_memory(["weights"])
                return res, v_dist

        res, v_dist = anyio.run(main)
    finally:
        stop()
    assert res.output_ids == [7] and res.matched == 7 and res.finish_reason == "stop"
    assert res.logprobs == [-0.5] and type(res.logprobs[0]) is float
    assert v_dist == {url: "v2"}
    assert seen["/generate"] == {
        "input_ids": [1, 2], "return_logprob": True,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.6, "stop": ["</a>"],
                            "stop_token_ids": [2], "sampling_seed": 3}}
    assert seen["/init_weights_update_group"] == {
        "master_address": "10.0.0.2", "master_port": 29500, "rank_offset": 1, "world_size": 5}
    assert seen["/update_weights_from_distributed"] == {
        "names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 3]], "weight_version": "v2"}
    assert seen["/update_weights_from_tensor"] == {"serialized_named_tensors": ["b64"], "weight_version": "v2"}
    assert seen["/update_weights_from_disk"] == {"model_path": "/ckpt/step-2", "weight_version": "v2"}
    assert seen["/pause_generation"] == {"mode": "abort"} and "/flush_cache" in seen
    # SGLang's ReleaseMemoryOccupationReqInput / ResumeMemoryOccupationReqInput: tags or null
    assert seen["/release_memory_occupation"] == {"tags": None}
    assert seen["/resume_memory_occupation"] == {"tags": ["weights"]}


def test_missing_route_and_unexpected_body_are_one_error_naming_route_and_engine():
    """An engine that is not SGLang 0.5.23 (a 404, or a body of another shape) gets one
    EngineError naming the route and the engine, no traceback, no retry of a 404."""
    calls = []

    async def model_info(request):
        calls.append(request.url.path)
        return JSONResponse({"weight_version": 3})  # no model_path, an int version

    async def generate(request):
        return JSONResponse({"text": "a", "output_ids": "oops"})

    app = Starlette(routes=[Route("/model_info", model_info), Route("/generate", generate,
                                                                  methods=["POST"])])
    url, stop = _serve(app)
    try:
        async def main(call):
            async with GenerationClient([url], FAST) as client:
                await call(client)

        for call, route in [
            (lambda c: c.flush_cache(), "POST /flush_cache"),  # 404 here
            (lambda c: c.weight_versions(), "GET /model_info"),
            (lambda c: c.generate([1, 2]), "POST /generate"),
        ]:
            with pytest.raises(EngineError) as info:
                anyio.run(main, call)
            assert isinstance(info.value, EngineProtocolError)  # not a request-only failure
            assert not isinstance(info.value, EngineRequestError)  # roles must not swallow it
            msg = str(info.value)
            assert url in msg and route in msg and "\n" not in msg, msg
    finally:
        stop()
    assert calls == ["/model_info"]


def test_policy_version_is_the_oldest_span():
    """meta_info.weight_versions (SGLang) -> the turn's policy version is the oldest."""
    from spade_async.generation.client import _result
    from spade_async.generation.protocol import GenerateOutput

    out = msgspec.json.decode(json.dumps({"text": "", "output_ids": [1, 2, 3], "meta_info": {
        "id": "r", "prompt_tokens": 1, "completion_tokens": 3, "finish_reason": None,
        "weight_version": "5", "weight_versions": [
            {"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 3}]}}),
        type=GenerateOutput)
    res = _result(out, "http://e")
    assert (res.weight_version, res.policy_version) == ("5", "4")
    out.meta_info.weight_versions = None  # an engine without spans: its one version
    assert _result(out, "http://e").policy_version == "5"
