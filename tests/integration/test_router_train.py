"""``spade train`` with ``engine.router = true`` (two CPU engines behind sglang-router), and
with ``engine.external`` (an engine this run did not start: attached, pushed to, left running)."""

from __future__ import annotations

import contextlib
import os

import httpx
import pytest
from loop_helpers import _config, _run, _steps

from spade_async.cli import main as cli_main
from spade_async.rundir import RunDir

pytest.importorskip("sglang_router")


@pytest.mark.slow  # ~45 s alone, over a minute on a loaded machine
@pytest.mark.timeout(600)
def test_two_steps_behind_the_router(tiny_model, tmp_path):
    cfg = _config(
        tiny_model, tmp_path, "fixed_pool", **{"engine.count": "2", "engine.router": "true"}
    )
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agent/episodes"] > 0 for r in steps)
    assert steps[-1]["router/healthy"] is True
    assert steps[-1]["engine/0/healthy"] and steps[-1]["engine/1/healthy"]
    assert steps[-1]["version"] >= 1  # pushes reached both engines directly
    assert (run_dir.root / "router.log").is_file()


@pytest.mark.timeout(600)
def test_external_engine_attached_pushed_and_left_running(tiny_model, tmp_path):
    from spade_async.generation.server import make_engine_app, serve_in_thread

    app = make_engine_app(str(tiny_model), context_length=4096)
    with serve_in_thread(app) as url:
        cfg = _config(
            tiny_model,
            tmp_path,
            "fixed_pool",
            **{"engine.count": "0", "engine.external": f"['{url}']"},
        )
        run_dir = RunDir(tmp_path / "run")
        _run(cfg, run_dir)
        steps = _steps(run_dir)
        assert [r["step"] for r in steps] == [1, 2] and steps[-1]["engine/0/healthy"]
        # the run pushed its weights to the engine it did not start, and left it running
        version = httpx.get(f"{url}/model_info").json()["weight_version"]
        assert version == str(steps[-1]["version"]) and int(version) >= 1
        assert httpx.get(f"{url}/health").status_code == 200


@contextlib.contextmanager
def _not_an_engine():
    """An HTTP server that answers /health but is no SGLang engine."""
    import socket
    import threading
    import time

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def ok(_request):
        return Response("ok")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/health", ok)])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.mark.parametrize("kind", ["unreachable", "not_an_engine"])
def test_bad_external_engine_is_one_line_exit_2(tmp_path, capsys, tiny_model, kind):
    from spade_async.watchdog import descendants

    with contextlib.ExitStack() as stack:
        url = (
            "http://127.0.0.1:9" if kind == "unreachable" else stack.enter_context(_not_an_engine())
        )
        argv = ["train", "configs/cpu-demo.toml", "--run-dir", str(tmp_path / "run")]
        argv += ["--set", f"model='{tiny_model}'", "--set", f"engine.external=['{url}']"]
        assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"external engine {url}" in err[0], err
    assert ("not reachable" if kind == "unreachable" else "/model_info") in err[0]
    assert descendants(os.getpid()) == []  # nothing was started, nothing is left


@pytest.mark.timeout(300)
def test_router_that_will_not_start_stops_the_run_one_line_nothing_left(
    tiny_model, tmp_path, capsys
):
    import socket

    from spade_async.watchdog import descendants

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["train", "configs/cpu-demo.toml", "--run-dir", str(tmp_path / "run")]
        argv += ["--set", f"model='{tiny_model}'", "--set", "engine.router=true"]
        argv += ["--set", f"engine.router_port={port}", "--set", "telemetry.dashboard='off'"]
        assert cli_main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "router" in err[0] and "exited with status" in err[0], err
    assert descendants(os.getpid()) == []  # engines, trainer and router are all gone
