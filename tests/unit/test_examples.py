"""Bundled example environments: coverage of skills, contract behaviour, replayable solutions.

In-process checks use ``load_env_class`` (these files are trusted); the sandboxed gates run
through ``check_file`` in ``test_examples_pass_the_sandboxed_gates``.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter

import pytest

from spade_async.envs.examples import (
    EXAMPLES,
    HERE,
    SKILLS,
    example_paths,
    load_env_class,
    skill_of,
)
from spade_async.errors import UsageError

GARBAGE = ["", "\\boxed{}", "the quick brown fox", "\\boxed{win}", "<answer></answer>"]
SEEDS = range(25)
ALL = example_paths()
IDS = [p.stem for p in ALL]


def test_table_matches_files_and_covers_every_skill():
    on_disk = {p.name for p in HERE.glob("*.py") if p.name != "__init__.py"}
    assert on_disk == set(EXAMPLES)
    games = Counter(skill for skill, setting in EXAMPLES.values() if setting == "games")
    assert all(games[s] >= 2 for s in SKILLS), games
    assert len(example_paths("games")) >= 12 and len(example_paths("tool_use")) >= 3
    assert skill_of(HERE / "mastermind.py") == "Logical_Deduction"
    assert example_paths("games", skill="Optimization") == [
        HERE / "peak_finder.py",
        HERE / "bin_packing.py",
    ]
    with pytest.raises(UsageError, match="unknown setting"):
        example_paths("chess")


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_source_is_stdlib_and_documented(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    skill, setting = EXAMPLES[path.name]
    assert f"Skill: {skill}. Setting: {setting}." in doc
    imports = {
        (a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imports <= set(sys.stdlib_module_names), imports
    if setting == "tool_use":  # reference style: the sandbox injects the base class
        assert "ToolUseBaseEnv" not in imports and "spade_async" not in imports
    assert 50 <= len(path.read_text().splitlines()) <= 160


def _replay(env, actions):
    reward, terminated, truncated, turns = 0.0, False, False, 0
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        turns += 1
        assert isinstance(obs, str) and isinstance(info, dict)
        assert -10 <= reward <= 10
        if terminated or truncated:
            break
    return reward, terminated, turns


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_solution_replays_to_success_and_garbage_never_wins(path):
    cls = load_env_class(path)
    for seed in SEEDS:
        env = cls()
        first, info = env.reset(seed)
        assert isinstance(first, str) and first and isinstance(info, dict)
        again = cls()
        assert again.reset(seed)[0] == first  # seeded determinism
        actions = env.solution()
        assert isinstance(actions, list) and len(actions) >= 2  # genuinely multi-turn
        reward, terminated, turns = _replay(env, actions)
        assert terminated and reward == 1.0, (seed, actions)
        assert turns == len(actions)  # no action after the end
        # replay the same actions on the twin: same observations and rewards
        twin = [again.step(a)[:2] for a in actions]
        fresh = cls()
        fresh.reset(seed)
        assert [fresh.step(a)[:2] for a in actions] == twin

        env = cls()
        env.reset(seed)
        for action in GARBAGE:
            _, reward, terminated, _, _ = env.step(action)
            assert reward < 1.0 and not terminated, (seed, action)


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_running_out_of_turns_truncates_with_partial_reward(path):
    cls = load_env_class(path)
    env = cls()
    env.reset(7)
    steps = 0
    while True:
        _, reward, terminated, truncated, _ = env.step("\\boxed{nothing useful}")
        steps += 1
        if terminated or truncated:
            break
        assert steps < 100
    assert truncated and not terminated
    assert 0.0 <= reward < 1.0 or reward == pytest.approx(-0.1)


@pytest.fixture(scope="module")
def sandboxed_verdicts():
    """Every example through the real gates, in one sandboxed pool."""
    import anyio

    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.envs.validate import validate_source

    async def run():
        async with EnvPool(PoolConfig(max_workers=4, prewarm=2)) as pool:
            verdicts = {p.name: await validate_source(p.read_text(), pool=pool) for p in ALL}
            tools = {}
            for p in example_paths("tool_use"):  # the injected base class serves get_tools()
                inst = await pool.open(p.read_text())
                await pool.reset(inst, 0)
                tools[p.name] = await pool.get_tools(inst)
                await pool.close(inst)
            return verdicts, tools

    return anyio.run(run)


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_examples_pass_the_sandboxed_gates(path, sandboxed_verdicts):
    verdict = sandboxed_verdicts[0][path.name]
    assert (verdict.valid, verdict.stage) == (True, "ok"), verdict.reason
    assert verdict.multi_turn is True and verdict.feasibility == "proven"
    assert verdict.env_class and verdict.env_class.endswith("Env")
    assert verdict.warnings == []


@pytest.mark.parametrize("path", example_paths("tool_use"), ids=lambda p: p.stem)
def test_tool_use_examples_export_openai_tools_from_the_sandbox(path, sandboxed_verdicts):
    tools = sandboxed_verdicts[1][path.name]
    assert len(tools) >= 2
    for tool in tools:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert fn["name"] and fn["description"] and fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])


def test_check_file_on_a_tool_use_example_relies_on_injection():
    from spade_async.envs.validate import check_file

    verdict = check_file(HERE / "org_chart_tool.py", seeds=(4, 5))
    assert verdict.valid and verdict.env_class == "OrgChartEnv" and verdict.feasibility == "proven"
