"""A held engine (restarting after a crash) gets no generation until it is released."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import anyio
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from spade_async.generation.client import ClientConfig, GenerationClient
from spade_async.generation.protocol import SamplingParams


@contextlib.contextmanager
def serve_in_thread(app: Starlette):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _engine(version: str, calls: list[str]) -> Starlette:
    async def generate(request):
        calls.append(version)
        return JSONResponse({"text": "", "output_ids": [5], "meta_info": {
            "id": "r", "prompt_tokens": 1, "completion_tokens": 1,
            "finish_reason": {"type": "length", "length": 1},
            "output_token_logprobs": [[-0.25, 5, None]], "weight_version": version}})  # fmt: skip

    return Starlette(routes=[Route("/generate", generate, methods=["POST"])])


def test_held_engines_get_nothing_and_a_lone_held_engine_is_waited_for():
    calls: list[str] = []
    with serve_in_thread(_engine("old", calls)) as a, serve_in_thread(_engine("new", calls)) as b:

        async def main() -> list[str]:
            async with GenerationClient([a, b], ClientConfig(backoff_s=0.01)) as client:
                sampling = SamplingParams(max_new_tokens=1)
                client.hold(a)  # a is least loaded and first: it would be picked
                got = [(await client.generate([1], sampling, session_key="s")).url]
                client.hold(b)  # every engine held: generation waits for a release
                with anyio.move_on_after(0.3) as waited:
                    await client.generate([1], sampling)
                assert waited.cancelled_caught
                async with anyio.create_task_group() as tg:

                    async def later() -> None:
                        await anyio.sleep(0.1)
                        client.release(a)

                    tg.start_soon(later)
                    got.append((await client.generate([1], sampling, session_key="s")).url)
                return got

        got = anyio.run(main)
    assert got == [b, a] and calls == ["new", "old"]
