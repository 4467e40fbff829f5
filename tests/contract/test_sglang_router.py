"""The router's flags and the worker API it calls, from the installed sglang-router 0.3.2
(its own argparse, ``sglang_router.router_args``) and the pinned SGLang's routes."""

from __future__ import annotations

import argparse

import pytest
from contract_checks import route_problem

from spade_async.generation import sglang_state


@pytest.fixture(scope="module")
def router_parser():
    router_args = pytest.importorskip("sglang_router.router_args")
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser)
    return parser, router_args.RouterArgs


def _our_argv() -> list[str]:
    from spade_async.launch.router import RouterServer

    argv = RouterServer(["http://127.0.0.1:30000", "http://127.0.0.1:30001"], port=31000).argv
    return argv[argv.index("sglang_router.launch_router") + 1 :]


def test_router_accepts_every_flag_we_pass(router_parser):
    parser, _ = router_parser
    known = {o for a in parser._actions for o in a.option_strings}
    argv = _our_argv()
    unknown = [a for a in argv if a.startswith("--") and a not in known]
    assert not unknown, f"sglang-router has no {unknown}"
    ns = parser.parse_args(argv)  # values of the right type and choice too
    assert ns.worker_urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert ns.policy == "cache_aware"


def test_the_worker_api_the_router_calls_is_sglangs(router_parser, sglang_src):
    """It probes ``health_check_endpoint`` (default /health; liveness under the launcher's
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0, so pushes do not mark workers down) and
    registers workers from /server_info, /get_server_info and /model_info."""
    _, args = router_parser
    probe = args.health_check_endpoint
    assert probe == "/health"
    for path in (probe, "/server_info", "/get_server_info", "/model_info"):
        assert route_problem(sglang_src, "GET", path) is None, route_problem(
            sglang_src, "GET", path
        )
    assert (
        sglang_state.HEALTH_GENERATION_ENV
        in sglang_src.files["sglang/srt/entrypoints/http_server.py"]
    )
