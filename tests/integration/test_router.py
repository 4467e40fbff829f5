"""A real sglang-router (0.3.2) in front of two CPU engines: sessions stick, both engines
serve, a killed engine is routed around, control calls reach each engine directly; the
router is a supervised child that never outlives the run."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import anyio
import pytest

from spade_async.engines import EngineConfig, running_engines
from spade_async.errors import ConfigError
from spade_async.generation.client import EngineError
from spade_async.generation.protocol import SamplingParams
from spade_async.launch.router import RoutedClient, RouterServer, running_router

pytest.importorskip("sglang_router")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _episode(client: RoutedClient, rng: random.Random, turns: int) -> list[str]:
    """One multi-turn episode: each prompt extends the last prompt + reply. Returns, per
    turn, the weight version of the engine that served it (the engines' ids here)."""
    ids = [rng.randrange(100, 40_000) for _ in range(48)]
    served = []
    for _ in range(turns):
        res = await client.generate(
            ids, SamplingParams(max_new_tokens=4, temperature=1.0), return_logprob=False
        )
        served.append(res.weight_version)
        ids = ids + res.output_ids + [rng.randrange(100, 40_000) for _ in range(8)]
    return served


@pytest.mark.anyio
async def test_router_sticky_both_serve_and_routes_around_a_dead_engine(tiny_model, tmp_path):
    cfg = EngineConfig(kind="cpu", count=1, threads=1, router=True, start_timeout_s=120)
    async with (
        # two engines told apart by their weight version ("100", "200")
        running_engines(cfg, tiny_model, tmp_path / "a", weight_version=100) as a,
        running_engines(cfg, tiny_model, tmp_path / "b", weight_version=200) as b,
    ):
        urls = [a[0].url, b[0].url]
        async with running_router(cfg, urls, tmp_path) as router:
            assert isinstance(router, RouterServer)
            router_pid = router.process.pid
            async with RoutedClient(router.url, urls) as client:
                rng = random.Random(0)
                served: list[list[str]] = []

                async def one() -> None:
                    served.append(await _episode(client, rng, 3))

                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(one)
                # every turn of an episode lands where its prefix is cached
                assert all(len(set(s)) == 1 for s in served), served
                # both engines serve (concurrent episodes spread by load)
                assert {s[0] for s in served} == {"100", "200"}, served
                # control calls fan out to each engine, not to the router
                assert set(await client.weight_versions()) == set(urls)
                assert (await client.check_health())[router.url] is True
                # a killed engine is routed around
                os.killpg(b[0].process.pid, signal.SIGKILL)
                for _ in range(6):
                    res = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=2))
                    assert res.weight_version == "100"
        assert not _alive(router_pid) or _reaped(router_pid)


def _reaped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.anyio
async def test_router_that_will_not_start_is_one_error_and_leaves_nothing(tmp_path):
    # the port is taken: the router exits during start-up
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = EngineConfig(kind="cpu", router=True, router_port=port)
        router_box: dict = {}
        with pytest.raises(BaseExceptionGroup) as err:
            async with running_router(cfg, ["http://127.0.0.1:9"], tmp_path) as router:
                router_box["r"] = router
        (leaf,) = err.value.exceptions  # the CLI prints this leaf as one line, exit 2
        assert isinstance(leaf, EngineError)
        assert "router" in str(leaf) and "exited with status" in str(leaf)
        assert "\n" not in str(leaf)
    assert not router_box
    assert not [p for p in _children() if "sglang_router" in p or "sglang::router" in p]


def _children() -> list[str]:
    from spade_async.watchdog import descendants

    out = []
    for pid in descendants(os.getpid()):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            pass
    return out


def test_router_policy_is_checked():
    with pytest.raises(ConfigError, match="router_policy"):
        RouterServer(["http://127.0.0.1:1"], port=1, policy="fastest")
