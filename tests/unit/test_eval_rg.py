"""reasoning-gym suites at the A.3 hard split: the reference's parameters, buckets, episodes
and problem choice; gold answers win, wrong ones lose; the same problems in every process."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from spade_async.eval.runner import evaluate
from spade_async.eval.suites import make_suite
from spade_async.eval.suites.rg_gen import _generate, applicable, generate
from spade_async.eval.suites.rg_hard import BUCKETS, HARD, episode_index, user_prompt

sys.path.insert(0, str(Path(__file__).parent))
from eval_scripted import Scripted, gold_reply, wrong_reply  # noqa: E402

RG = ["rg_math", "rg_algorithmic", "rg_cognition", "rg_logic"]


def test_buckets_are_the_references_31_36_24_9_over_the_100_hard_tasks():
    assert {b: len(t) for b, t in BUCKETS.items()} == {
        "math": 31, "algorithmic": 36, "cognition": 24, "logic": 9}  # fmt: skip
    every = [t for tasks in BUCKETS.values() for t in tasks]
    assert len(every) == len(set(every)) == 100 and set(every) == set(HARD)
    # the reference's episode e draws random.choice(dataset of 500) after random.seed(e)
    assert [episode_index(e) for e in range(3)] == [432, 68, 489]


def test_every_hard_parameter_exists_in_the_installed_reasoning_gym():
    from reasoning_gym.factory import DATASETS

    missing = [n for task in HARD for n in applicable(task, DATASETS[task][1])[1]]
    assert missing == []


def test_a_parameter_the_config_lacks_is_a_note_not_a_crash():
    @dataclasses.dataclass
    class FakeConfig:
        length: int = 10

    params, notes = applicable("ab", FakeConfig)
    assert params == {"length": 25}
    assert applicable("bf", FakeConfig) == (
        {}, ["task bf: hard parameter difficulty=2 is not in the installed reasoning-gym's "
             "FakeConfig; left at its default"])  # fmt: skip


def test_generated_problems_carry_the_hard_values():
    rows, notes, params = generate(["ab", "zebra_puzzles", "caesar_cipher"], 8, 42, 6)
    assert notes == []
    by = {(r["task"], r["episode"]): r["entry"]["metadata"] for r in rows}
    assert by["ab", 0]["difficulty"] == {"length": HARD["ab"]["length"]}
    zebra = HARD["zebra_puzzles"]
    assert by["zebra_puzzles", 1]["difficulty"] == {
        "num_people": zebra["num_people"], "num_characteristics": zebra["num_characteristics"]}  # fmt: skip
    caesar = HARD["caesar_cipher"]
    assert by["caesar_cipher", 0]["difficulty"]["words"] == (
        caesar["min_words"],
        caesar["max_words"],
    )
    assert [by["ab", e]["source_index"] for e in (0, 1)] == [episode_index(0), episode_index(1)]
    assert params["caesar_cipher"] == caesar


def test_an_unwinnable_problem_is_named_and_an_overrunning_generator_is_skipped():
    _, notes, _ = generate(["jugs"], 1, 42, 1)  # hard jugs episode 0: "No solution"
    assert len(notes) == 1 and "jugs episode 0" in notes[0] and "unwinnable" in notes[0]
    code = (
        "import signal, time\n"
        "from spade_async.eval.suites import rg_gen as g\n"
        "g.ENTRY_BUDGET_S = 1\n"
        "signal.signal(signal.SIGALRM, g._alarm)\n"
        "class Slow:\n"
        "    def __getitem__(self, i):\n"
        "        while True:\n"
        "            try:\n"
        "                time.sleep(10)\n"
        "            except Exception:\n"  # a generator's retry loop must not eat the overrun
        "                pass\n"
        "notes = []\n"
        "print(g._entry('slow_task', Slow(), 2, notes), notes)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == (
        "None ['task slow_task episode 2 (problem 489) skipped: its generator ran past 1 s']"
    ), out.stderr


def test_same_problems_in_two_processes():
    tasks = ("polynomial_equations", "course_schedule", "word_ladder")  # hash-order sensitive
    first = _generate.__wrapped__(tasks, 2, 42, 6)
    second = _generate.__wrapped__(tasks, 2, 42, 6)
    assert first == second


def test_gold_wins_and_wrong_loses_on_each_rg_bucket(tmp_path):
    async def main():
        gold = await evaluate(RG, Scripted(gold_reply), out=tmp_path, model="gold", limit=3, n=1)
        wrong = await evaluate(RG, Scripted(wrong_reply), out=None, model="wrong", limit=3, n=1)
        return gold, wrong

    gold, wrong = anyio.run(main)
    for name in RG:
        assert gold.suites[name].metrics["avg@1"] == 1.0, name
        assert gold.suites[name].n_problems == 3, name
        assert wrong.suites[name].metrics["avg@1"] == 0.0, name
        assert gold.suites[name].notes == [], name


def test_prompt_is_one_user_message_in_the_references_words():
    item = make_suite("rg_logic").load(1)[0]
    assert item.id == "acre/0" and item.meta["index"] == episode_index(0)
    assert item.messages == [
        {"role": "user", "content": user_prompt(item.meta["entry"]["question"])}
    ]
    text = item.messages[0]["content"]
    assert text.startswith("Given a problem, your task is to answer the question")
    assert "<answer>answer here</answer>" in text and "\\boxed{}" in text


_PROBE = """
import os, sys

class RgProbeEnv:
    def __init__(self, max_turns=1, **kw):
        self.msg = []
        for name in ("reasoning_gym", "torch"):
            try:
                __import__(name)
                self.msg.append("imported")
            except ImportError as exc:
                self.msg.append(type(exc).__name__)
        self.msg.append(str(os.path.exists(HOST)))
    def reset(self, seed=None):
        return " ".join(self.msg), {}
    def step(self, action):
        return "", 0.0, True, False, {}
"""


def test_only_the_named_packages_reach_a_bubblewrap_worker():
    """Environments are standard library only unless the pool names packages; then those and
    their requirements are importable, read-only, and nothing else of the venv or project."""
    from spade_async.envs import sandbox
    from spade_async.envs.pool import EnvPool, PoolConfig

    if sandbox.probe_all()["bwrap"] is not None:
        pytest.skip("bubblewrap does not work on this machine")
    source = f"HOST = {str(Path(__file__).resolve())!r}\n" + _PROBE

    async def probe(packages):
        cfg = PoolConfig(isolation="bwrap", prewarm=0, max_workers=1, packages=packages)
        async with EnvPool(cfg) as pool:
            inst = await pool.open(source)
            return (await pool.reset(inst, seed=0))[0]

    assert anyio.run(probe, ()) == "ModuleNotFoundError ModuleNotFoundError False"
    assert anyio.run(probe, ("reasoning-gym",)) == "imported ModuleNotFoundError False"


def test_a_package_that_is_not_installed_is_a_one_line_error():
    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.errors import SpadeError

    with pytest.raises(SpadeError, match="envs.packages names 'no-such-dist', which is not"):
        EnvPool(PoolConfig(packages=("no-such-dist",)))


def _episodes_in_order(rows, params, answers) -> list[float]:
    return _episodes(rows, params, answers, concurrent=False)


def _episodes(rows, params, answers, *, concurrent=True) -> list[float]:
    """Each row played as the suite plays it: one episode in the package pool."""
    import contextlib

    from spade_async.eval.runner import open_package_pool
    from spade_async.eval.suites import Context
    from spade_async.eval.suites.rg import play_episode
    from spade_async.eval.types import Item

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            pool = await open_package_pool([make_suite("rg_logic")], stack)
            ctx = Context(None, None, None, None, package_pool=pool)
            out = [0.0] * len(rows)

            async def one(i, r):
                meta = {"task": r["task"], "params": params[r["task"]], "entry": r["entry"]}
                item = Item(id=f"{r['task']}/{r['episode']}", messages=[], answer="", meta=meta)
                out[i] = await play_episode(ctx, item, answers[i])

            if not concurrent:
                for i, r in enumerate(rows):
                    await one(i, r)
                return out
            async with anyio.create_task_group() as tg:
                for i, r in enumerate(rows):
                    tg.start_soon(one, i, r)
            return out

    return anyio.run(main)


# 100 sandboxed episodes, each booting its task's packages: ~65 s on a quiet 2-core VM, over
# 120 s (the suite's hang guard) on a contended one; the timeout guards hangs, not speed.
# Slow (make test-slow): the default suite keeps test_gold_wins_and_wrong_loses_on_each_rg_bucket.
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_gold_answers_win_episode_zero_of_every_hard_task_but_two():
    """All 100 tasks, episode 0, played as the suite plays them: only ``rush_hour`` (no
    reference solution ships) and ``jugs`` (hard episode 0 is "No solution") do not win;
    the 5x5 ``rubiks_cube`` wins by undoing its scramble."""
    from spade_async.eval.suites.rg import _gold

    rows, notes, params = generate(sorted(HARD), 1, 42, 0)
    assert len(rows) == 100 and len(notes) == 1 and "jugs" in notes[0]
    rewards = _episodes(rows, params, [_gold(r["entry"]) for r in rows])
    assert {r["task"] for r, x in zip(rows, rewards, strict=True) if x < 1.0} == {"rush_hour", "jugs"}


def test_undoing_the_scramble_solves_every_hard_rubiks_cube_episode():
    from spade_async.eval.suites.rg import _gold

    rows, _, params = generate(["rubiks_cube"], 8, 42, 0)
    scramble = rows[0]["entry"]["metadata"]["scramble_moves"]
    assert any(m[0] == "2" for m in scramble.split())  # slice moves its scorer cannot read
    assert _episodes(rows, params, [_gold(r["entry"]) for r in rows]) == [1.0] * 8
    assert _episodes(rows[:1], params, ["R U"])[0] < 1.0


def test_a_hostile_answer_runs_only_inside_the_sandbox(tmp_path):
    """countdown's scorer hands the answer to sympy's ``parse_expr``, which evaluates it: a
    model's answer is code there. Played in the sandbox it reaches no host file, an endless
    one is cut by the call timeout, neither wins, and the pool goes on scoring."""
    from spade_async.envs import sandbox
    from spade_async.eval.suites.rg import _gold

    if sandbox.probe_all()["bwrap"] is not None:
        pytest.skip("bubblewrap does not work on this machine")
    target = tmp_path / "written-by-the-answer"
    rows, _, params = generate(["countdown"], 1, 42, 0)
    hostile = [
        f"__import__('pathlib').Path({str(target)!r}).write_text('x')",
        "__import__('time').sleep(3600)",
    ]
    rows = [rows[0]] * 3
    wrote, slept, gold = _episodes(rows, params, [*hostile, _gold(rows[0]["entry"])])
    assert wrote < 1.0 and not target.exists()  # the scorer's own "malformed" partial credit
    assert slept == 0.0 and gold == 1.0  # the call timeout killed the sleeper's worker


def test_saved_rg_completions_are_rescored_as_episodes(tmp_path):
    import json

    from spade_async.eval.rescore import rescore

    async def main():
        await evaluate(["rg_logic"], Scripted(gold_reply), out=tmp_path, model="gold", limit=2, n=1)
        path = tmp_path / "rg_logic.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        lines[1]["completion"] = "<answer>certainly not this</answer>"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return await rescore(path, ["rg_logic"], None, {})

    res = anyio.run(main)
    assert res.suites["rg_logic"].metrics["avg@1"] == 0.5


def test_an_answer_cannot_forge_another_episodes_verdict():
    """An answer that the scorer evaluates rewrites the environment's ``step`` to always
    win; every episode plays in a worker of its own, so a later wrong answer still loses."""
    from spade_async.envs import sandbox

    if sandbox.probe_all()["bwrap"] is not None:
        pytest.skip("bubblewrap does not work on this machine")
    rows, _, params = generate(["countdown"], 1, 42, 0)
    forge = (
        "exec(\"import sys\\nm = sys.modules['env_module']\\n"
        "m.ReasoningGymEnv.step = lambda self, a: ('', 1.0, True, False, {})\")"
    )
    assert _episodes(rows, params, [forge]) == [0.01]  # parse_expr ran it, then failed
    wrong = "certainly not this"
    assert _episodes([rows[0]] * 2, params, [forge, wrong])[1] < 1.0
    # sequentially too, in one pool: the forger's worker is gone before the next opens
    assert _episodes_in_order([rows[0]] * 2, params, [forge, wrong])[1] < 1.0
