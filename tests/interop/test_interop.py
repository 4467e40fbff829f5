"""The real libraries (``make test-interop``: .venv-interop from requirements/interop.lock).

Sources: each of rg:, gym:, gem:, verifiers: imported into memory through the gates and one
CPU training step on it (a tiny model, fixed_pool mode; test_interop_verifiers.py checks the
verifiers: source's rewards against verifiers' own). Targets: the demo run's memory exported to
verifiers and to OpenEnv, one episode played through each library's own client with the
environment's solution(), and the reward equal to the one spade-async's sandbox gives.
Skipped, with the reason, where the packages are not installed (the default suite)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import anyio
import pytest

NEEDED = ("verifiers", "openenv", "gem", "gymnasium", "reasoning_gym", "spade_textgym",
          "spade_vfguess")  # fmt: skip
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"interop packages not installed ({', '.join(MISSING)}): run `make test-interop`",
    ),
]
DEMO = Path(__file__).resolve().parents[1] / "fixtures" / "demo_run"
SOURCES = {
    "rg": ("rg:leg_counting,basic_arithmetic?size=8", ["reasoning-gym"]),
    "gym": ("gym:spade_textgym:spade/GuessNumber-v0", ["gymnasium", "spade-textgym"]),
    "gem": ("gem:game:GuessTheNumber-v0-easy", ["gem-llm"]),
    "verifiers": ("verifiers:spade_vfguess?size=6", ["verifiers", "spade-vfgames"]),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scheme", sorted(SOURCES))
def test_source_imports_and_trains_one_step(scheme, tiny_model, tmp_path):
    from spade_async import recipe
    from spade_async.loop.run import train
    from spade_async.memory.store import MemoryStore
    from spade_async.rundir import RunDir

    value, packages = SOURCES[scheme]
    cfg = recipe.load(None, [
        "mode='fixed_pool'", "schedule='sync'", f"model='{tiny_model}'", "max_steps=1",
        "replay_envs=2", "initial_memory=''", f"fixed_pool='{value}'", "checkpoint_every=1",
        "agent.plays_nohint=2", "agent.max_turns=2", "agent.max_turn_tokens=6",
        "agent.cut_reply='step'", "trainer.micro_batch_tokens=1024",
        "telemetry.dashboard='off'", "envs.max_workers=4", "envs.open_timeout_s=120",
        "envs.call_timeout_s=20", f"envs.packages={packages!r}",
    ])  # fmt: skip
    run_dir = RunDir(tmp_path / "run")
    run_dir.create().write_config(cfg)
    assert anyio.run(train, cfg, run_dir) == 0
    with MemoryStore(run_dir.memory, cfg.memory) as store:
        records = list(store.records())
    assert records and all(r.valid for r in records), [(r.stage, r.reason) for r in records]
    assert all(
        r.origin.kind == "pool" and r.origin.source.startswith(f"{scheme}:") for r in records
    )
    assert run_dir.latest_checkpoint()[0] == 1
    assert sum(r.stats.plays_nohint for r in records) > 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from spade_async.memory.cli import main as memory_main

    root = tmp_path_factory.mktemp("export")
    shutil.copytree(DEMO, root / "run", ignore=shutil.ignore_patterns("lock.mdb"))
    for fmt in ("verifiers", "openenv"):
        assert memory_main(["export", str(root / fmt), "--format", fmt, "--run",
                            str(root / "run"), "--name", f"demo_{fmt}"]) == 0  # fmt: skip
        sys.path.insert(0, str(root / fmt))
    yield root
    for fmt in ("verifiers", "openenv"):
        sys.path.remove(str(root / fmt))


def _ours(module: str, seed: int) -> tuple[list[str], float]:
    """solution() and the reward replaying it gives in spade-async's own sandbox."""
    from spade_async.envs.gym import SandboxedEnv
    from spade_async.envs.validate import solution_actions

    env = SandboxedEnv(importlib.import_module(module).SOURCE)
    try:
        env.reset(seed=seed)
        actions = solution_actions(env.solution())
        env.reset(seed=seed)
        reward = 0.0
        for a in actions:
            _, reward, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        return actions, reward
    finally:
        env.close()


@pytest.mark.timeout(600)
def test_verifiers_loads_and_plays(exported):
    import httpx
    import verifiers as vf
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    env = vf.load_environment("demo_verifiers", seeds=[0, 1])  # verifiers' own loader
    assert isinstance(env, vf.MultiTurnEnv) and len(env.dataset) == 2 * len(
        importlib.import_module("demo_verifiers").ENVIRONMENTS
    )
    pkg = importlib.import_module("demo_verifiers")
    for i in (0, 3):  # a tool-use and a games environment of the demo run
        row = env.dataset[i]
        actions, ours = _ours(pkg.ENVIRONMENTS[row["info"]["env"]], row["info"]["seed"])
        replies = iter(actions)

        def reply(request: httpx.Request, replies=replies) -> httpx.Response:
            message = {"role": "assistant", "content": next(replies, "")}
            return httpx.Response(200, json={
                "id": "x", "object": "chat.completion", "created": 0, "model": "solution",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })  # fmt: skip

        oai = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="none",
                          http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))  # fmt: skip
        inp = {"prompt": row["prompt"], "example_id": i, "answer": "", "info": row["info"]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = asyncio.run(env.run_rollout(inp, OpenAIChatCompletionsClient(oai), "m", {}))
        assert out["error"] is None
        assert out["reward"] == ours == 1.0


@pytest.mark.timeout(600)
def test_openenv_serves_and_plays(exported):
    import httpx

    pkg = importlib.import_module("demo_openenv")
    names = list(pkg.ENVIRONMENTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "demo_openenv.server.app:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "critical"],
        cwd=exported / "openenv",
    )  # fmt: skip
    try:
        for _ in range(240):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)

        async def play(name: str, seed: int, actions: list[str]):
            async with pkg.SpadeEnvClient(base_url=f"http://127.0.0.1:{port}") as client:
                result = await client.reset(env=name, seed=seed)
                assert result.observation.env == name and result.observation.text
                for a in actions:
                    result = await client.step(pkg.SpadeAction(text=a))
                    if result.done:
                        break
                return result, await client.state()

        for name in (names[1], names[3]):
            actions, ours = _ours(pkg.ENVIRONMENTS[name], 3)
            result, state = asyncio.run(play(name, 3, actions))
            assert result.done and result.reward == ours == 1.0
            assert (state.env, state.seed, state.step_count) == (name, 3, len(actions))
    finally:
        server.terminate()
        server.wait(30)
