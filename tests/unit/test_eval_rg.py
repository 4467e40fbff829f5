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
class RgProbeEnv:
    def __init__(self, max_turns=1, **kw):
        try:
            import reasoning_gym  # noqa: F401
            self.msg = "imported"
        except ImportError as exc:
            self.msg = type(exc).__name__
    def reset(self, seed=None):
        return self.msg, {}
    def step(self, action):
        return "", 0.0, True, False, {}
"""


def test_reasoning_gym_is_out_of_reach_of_a_bubblewrap_worker():
    """Why rg scores in a checker process (rg.py docstring): if the sandbox ever binds the
    libraries, this fails and the suite can become an episode in the pool."""
    from spade_async.envs import sandbox
    from spade_async.envs.pool import EnvPool, PoolConfig

    if sandbox.probe_all()["bwrap"] is not None:
        pytest.skip("bubblewrap does not work on this machine")

    async def main():
        async with EnvPool(PoolConfig(isolation="bwrap", prewarm=0, max_workers=1)) as pool:
            inst = await pool.open(_PROBE)
            return (await pool.reset(inst, seed=0))[0]

    assert anyio.run(main) == "ModuleNotFoundError"


def test_gold_answers_win_episode_zero_of_every_hard_task_but_two():
    """All 100 tasks, episode 0, scored as the suite scores: only ``rush_hour`` (no
    reference solution ships) and ``jugs`` (hard episode 0 is "No solution") do not win;
    the 5x5 ``rubiks_cube`` wins by undoing its scramble."""
    from spade_async.eval.checker import Checker, rg_score
    from spade_async.eval.suites.rg import _gold

    rows, notes, params = generate(sorted(HARD), 1, 42, 0)
    assert len(rows) == 100 and len(notes) == 1 and "jugs" in notes[0]
    with Checker(workers=2) as checker:
        lost = {
            r["task"]
            for r in rows
            if checker.call_sync(
                rg_score, r["task"], 42, 500, params[r["task"]], r["entry"], _gold(r["entry"])
            )
            < 1.0
        }
    assert lost == {"rush_hour", "jugs"}


def test_undoing_the_scramble_solves_every_hard_rubiks_cube_episode():
    from spade_async.eval.checker import rg_score
    from spade_async.eval.suites.rg import _gold

    rows, _, params = generate(["rubiks_cube"], 8, 42, 0)
    scramble = rows[0]["entry"]["metadata"]["scramble_moves"]
    assert any(m[0] == "2" for m in scramble.split())  # slice moves its scorer cannot read
    assert all(
        rg_score("rubiks_cube", 42, 500, params["rubiks_cube"], r["entry"], _gold(r["entry"]))
        == 1.0
        for r in rows
    )
    assert rg_score("rubiks_cube", 42, 500, params["rubiks_cube"], rows[0]["entry"], "R U") < 1.0
