"""reasoning-gym on hand-made completions: the answer a careful reader takes is what is
scored, and it is scored by reasoning-gym's own (strict) ``score_answer``; reasoning-gym's own
``extract_answer`` is run beside it to show where its extraction alone would differ."""

from __future__ import annotations

import contextlib
import functools

import anyio
import pytest

from spade_async.eval.extract import last_answer_tag
from spade_async.eval.runner import open_package_pool
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.suites.rg_gen import applicable
from spade_async.eval.types import Item

TASKS = ["basic_arithmetic", "spell_backward", "gcd"]

# (completion template, the answer a careful reader takes: "gold", "wrong" or a template,
#  does reasoning-gym's own extract_answer take the same answer?)
FORMS = [
    ("Thinking... <answer>{g}</answer>", "{g}", True),
    ("<answer>\\boxed{{{g}}}</answer>", "{g}", False),  # the prompt asks for both
    ("<answer>{g}</answer>\nFormat: <answer>answer here</answer>", "{g}", False),  # echo
    ("<answer>$\\boxed{{{g}}}$</answer>", "{g}", False),
    ("<answer>  {g}  </answer>", "{g}", True),
    ("So the result is \\boxed{{{g}}}.", "{g}", False),  # no tag: the reference's fallback
    ("<answer>zzz-not-it</answer>", "zzz-not-it", True),
    ("<answer>zzz-not-it</answer> then <answer>{g}</answer>", "{g}", True),
    ("<answer>The answer is {g}</answer>", "The answer is {g}", True),  # strict scorer decides
]


@functools.lru_cache(maxsize=1)
def _rows():
    """One problem per task at the hard parameters, made here (any problem will do: what is
    tested is how its answer is read and scored, not which problem the suite draws)."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    params = {t: applicable(t, DATASETS[t][1])[0] for t in TASKS}
    rows = [{"task": t, "entry": reasoning_gym.create_dataset(t, seed=42, size=1, **params[t])[0]}
            for t in TASKS]  # fmt: skip
    return rows, params


def _cases(rows, params):
    cases = []  # (item, completion, intended answer, entry, rg's own extraction agrees)
    for r in rows:
        gold = str(r["entry"]["answer"])
        item = Item(id=r["task"], messages=[], answer=gold,
                    meta={"task": r["task"], "params": params[r["task"]], "entry": r["entry"]})  # fmt: skip
        for template, intended, rg_agrees in FORMS:
            cases.append(
                (item, template.format(g=gold), intended.format(g=gold), r["entry"], rg_agrees)
            )
    return cases


def _play(suite, cases):
    """Each completion scored as the suite scores it: an episode in the package pool."""

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            pool = await open_package_pool([suite], stack)
            ctx = Context(None, None, None, None, package_pool=pool)
            out = [None] * len(cases)

            async def one(i, item, text):
                out[i] = await suite.score(item, text, ctx)

            async with anyio.create_task_group() as tg:
                for i, (item, text, *_) in enumerate(cases):
                    tg.start_soon(one, i, item, text)
            return out

    return anyio.run(main)


def test_hand_made_completions_read_as_a_reader_reads_them_scored_by_rg_s_own_scorer():
    """Extraction on the host, reasoning-gym's ``score_answer`` of what was extracted."""
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    rows, params = _rows()
    cases = _cases(rows, params)
    assert len(cases) >= 20
    # score_answer judges the entry it is given; a one-problem dataset of the same config
    datasets = {t: reasoning_gym.create_dataset(t, seed=42, size=1, **params[t]) for t in TASKS}
    scores = []
    for item, text, intended, entry, rg_agrees in cases:
        assert last_answer_tag(text) == intended, text
        assert (extract_answer(text) == intended) is rg_agrees, text
        scores.append(
            1.0 if datasets[item.meta["task"]].score_answer(intended, entry) >= 1.0 else 0.0
        )
    # per task: the right answer in every tolerated form wins; the wrong one and the sentence lose
    for t in range(len(TASKS)):
        assert scores[9 * t : 9 * t + 9] == [1.0] * 6 + [0.0, 1.0, 0.0], TASKS[t]


def test_the_suite_scores_those_forms_in_the_sandbox():
    rows, params = _rows()
    cases = [c for c in _cases(rows[:1], params) if c[2] != "zzz-not-it"][1:3]  # boxed, echo
    ours = _play(make_suite("rg_math"), cases)
    assert [s for _, s in ours] == [1.0, 1.0]
    assert [e for e, _ in ours] == [c[2] for c in cases]


@pytest.mark.slow
def test_every_hand_made_completion_scores_in_the_sandbox_as_rg_scores_it():
    import reasoning_gym

    rows, params = _rows()
    cases = _cases(rows, params)
    ours = _play(make_suite("rg_math"), cases)
    datasets = {t: reasoning_gym.create_dataset(t, seed=42, size=500, **params[t]) for t in TASKS}
    for (item, text, intended, entry, _), (extracted, score) in zip(cases, ours, strict=True):
        want = 1.0 if datasets[item.meta["task"]].score_answer(intended, entry) >= 1.0 else 0.0
        assert (extracted, score) == (intended, want), text


def test_placeholder_and_empty_tags_are_not_answers():
    assert last_answer_tag("<answer>7</answer> <answer>answer here</answer>") == "7"
    assert last_answer_tag("<answer>7</answer> <answer></answer>") == "7"
    assert last_answer_tag("<answer>answer here</answer>") is None
    assert last_answer_tag("<answer>\\boxed{\\frac{1}{2}}</answer>") == "\\frac{1}{2}"
    assert (
        last_answer_tag("<answer>\\boxed{1} and \\boxed{2}</answer>") == "\\boxed{1} and \\boxed{2}"
    )
