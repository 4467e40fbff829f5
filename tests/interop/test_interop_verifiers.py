"""The ``verifiers:`` source against the real verifiers 0.2.1 (``make test-interop``).

The environments of tests/fixtures/vfgames_pkg, imported as sources and played in
spade-async's sandbox: the reward of a conversation equals the one verifiers itself gives the
same replies (``Environment.run_rollout`` with its own ``OpenAIChatCompletionsClient`` over a
scripted model), ``solution()`` plays to 1.0, and the bad values are one line, exit 2,
nothing stored, while environments that crash or hang are rejected records.
Skipped, with the reason, where the packages are not installed (the default suite)."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import warnings

import anyio
import pytest

NEEDED = ("verifiers", "spade_vfguess", "spade_vfsum", "spade_vfodd")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"interop packages not installed ({', '.join(MISSING)}): run `make test-interop`",
    ),
]
PACKAGES = ("verifiers", "spade-vfgames")


def _made(value: str) -> tuple[str, list[dict], list[str]]:
    """The source ``value`` makes (one environment), its ROWS literal and the notes."""
    from spade_async.envs import sources

    _, (item,), notes = sources.load(value)
    assert item.packages == ("spade-vfgames",) and item.origin.startswith(value.split("?")[0])
    for node in ast.parse(item.code).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROWS":
            return item.code, ast.literal_eval(node.value), notes
    raise AssertionError("no ROWS in the source")


def _sandboxed(code: str):
    from spade_async.envs.gym import SandboxedEnv
    from spade_async.envs.pool import PoolConfig

    config = PoolConfig(packages=PACKAGES, prewarm=0, max_workers=1, open_timeout_s=120.0,
                        call_timeout_s=30.0)  # fmt: skip
    return SandboxedEnv(code, pool_config=config)


def _play(env, seed: int, replies: list[str]) -> tuple[str, list[tuple]]:
    obs, _ = env.reset(seed=seed)
    steps = []
    for reply in replies:
        steps.append(env.step(reply))
        if steps[-1][2] or steps[-1][3]:
            break
    return obs, steps


def _verifiers_reward(module: str, example_id: int, replies: list[str]) -> float:
    """What verifiers itself gives: ``run_rollout`` on the dataset row, its own OpenAI
    chat-completions client over a model that says ``replies`` in turn."""
    import httpx
    import verifiers as vf
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    env = vf.load_environment(module)
    (row,) = [r for r in env.get_dataset().to_list() if r["example_id"] == example_id]
    said = iter(replies)

    def reply(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": next(said, "")}
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip

    oai = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="none",
                      http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = asyncio.run(env.run_rollout(row, OpenAIChatCompletionsClient(oai), "m", {}))
    assert out["error"] is None
    return out["reward"]


@pytest.mark.timeout(900)
def test_multi_turn_rewards_are_verifiers_own():
    code, rows, notes = _made("verifiers:spade_vfguess?size=4")
    assert not notes and len(rows) == 4 and all(r["turns"] == 1 for r in rows)
    env = _sandboxed(code)
    try:
        obs, steps = _play(env, 1, ["<guess>3</guess>", "<guess>14</guess>", "<guess>11</guess>"])
        assert rows[1]["answer"] == "11" and "from 1 to 15" in obs and "<guess>N</guess>" in obs
        assert [s[0] for s in steps] == ["3 is wrong: the secret is higher.",
                                         "14 is wrong: the secret is lower.", "Correct!"]  # fmt: skip
        assert [s[1:4] for s in steps[:2]] == [(0.0, False, False)] * 2 and steps[2][2]
        ours = steps[2][1]  # correct 0.8 + speed 0.2 / 3 turns
        assert ours == pytest.approx(0.8 + 0.2 / 3, abs=1e-12)
        assert ours == _verifiers_reward("spade_vfguess", rows[1]["example_id"],
                                         ["<guess>3</guess>", "<guess>14</guess>", "<guess>11</guess>"])  # fmt: skip
        env.reset(seed=5)  # row 5 % 4 = 1 again: one row per seed
        solution = env.solution()
        _, steps = _play(env, 5, solution)
        assert steps[-1][1:3] == (1.0, True)
        assert _verifiers_reward("spade_vfguess", rows[1]["example_id"], solution) == 1.0
    finally:
        env.close()


@pytest.mark.timeout(900)
def test_single_turn_rewards_and_own_answers():
    code, rows, notes = _made("verifiers:spade_vfsum?size=8")
    assert notes == ["row 5 left out: its own answer scores 0"]  # the fixture's wrong answer
    assert [r["example_id"] for r in rows] == [0, 1, 2, 3, 4, 6, 7]
    env = _sandboxed(code)
    try:
        # seed 0: row 0, 2 + 1 (right); seed 5: row 6, 20 + 31 (wrong); seed 6: row 7, no box
        plays = ((0, "\\boxed{3}", 1.0), (5, "\\boxed{43}", 0.0), (6, "The sum is 99.", 0.0))
        for seed, reply, reward in plays:
            row = rows[seed % len(rows)]
            _, steps = _play(env, seed, [reply])
            assert len(steps) == 1 and steps[0][1:4] == (reward, True, False)
            assert reward == _verifiers_reward("spade_vfsum", row["example_id"], [reply])
            env.reset(seed=seed)
            _, steps = _play(env, seed, env.solution())
            assert steps[-1][1:3] == (1.0, True)
    finally:
        env.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "value, message",
    [
        ("verifiers:spade_vfnothing", "needs the Python package 'spade_vfnothing'"),
        ("verifiers:spade_vfodd", "'spade_vfodd' is not a verifiers environment module"),
        ("verifiers:spade_vfodd.tools", "is not a text environment: it is a tool environment"),
        ("verifiers:spade_vfodd.image", "is not a text environment: its prompts are not text"),
        ("verifiers:spade_vfguess?attempts=2", "unknown option 'attempts' for 'verifiers:'"),
    ],
)
def test_bad_values_are_one_line_and_nothing_stored(tmp_path, capsys, value, message):
    from spade_async.cli.dispatch import main

    run = tmp_path / "run"
    assert main(["memory", "import", value, "--run", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run.exists()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("module, stages", [("crash", ("crash",)), ("hang", ("timeout",))])
def test_an_env_that_crashes_or_hangs_is_rejected(tmp_path, monkeypatch, module, stages):
    """Its own answers cannot be checked (the child's check dies or runs out of time): every
    row is kept unverified and the gates judge it, sandboxed, like a generated environment."""
    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.envs.sources import verifiers as vf_source
    from spade_async.memory.importer import import_files, preload
    from spade_async.memory.store import MemoryStore

    monkeypatch.setattr(vf_source, "CHECK_S", 3.0)
    value = f"verifiers:spade_vfodd.{module}"
    loaded = preload(value)
    assert "every row kept, feasibility unverified" in loaded.notes[-1]

    async def run(store):
        config = PoolConfig(packages=loaded.packages, open_timeout_s=120.0, call_timeout_s=5.0,
                            max_workers=2)  # fmt: skip
        async with EnvPool(config) as pool:
            return await import_files(store, loaded, pool=pool)

    with MemoryStore(tmp_path / "memory.lmdb") as store:
        (out,) = anyio.run(run, store)
        assert out.outcome == "rejected" and out.stage in stages, (out.stage, out.reason)
        (rec,) = list(store.records())
        assert not rec.valid and rec.origin.source.startswith(value)


def test_a_recipe_must_bind_the_environments_own_distribution():
    """The worker imports the environment's module too, not only verifiers: a fixed pool
    whose envs.packages leaves out the module's distribution is refused at start, naming it."""
    from spade_async import recipe
    from spade_async.errors import ConfigError

    base = ["mode='fixed_pool'", "fixed_pool='verifiers:spade_vfguess?size=6'"]
    with pytest.raises(ConfigError, match="imports 'spade-vfgames' in the sandbox"):
        recipe.load(None, [*base, "envs.packages=['verifiers']"])
    cfg = recipe.load(None, [*base, "envs.packages=['verifiers', 'spade-vfgames']"])
    assert set(cfg.envs.packages) == {"verifiers", "spade-vfgames"}
