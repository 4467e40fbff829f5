"""Every shipped suite: a gold-answer engine scores exactly 1.0, a wrong one 0.0; hostile
code is contained and scores 0; user-file suites load, score, and fail with one line."""

import json
import sys
from pathlib import Path

import anyio
import pytest

from spade_async.envs.pool import EnvPool
from spade_async.errors import SpadeError
from spade_async.eval.checker import Checker, math_equal
from spade_async.eval.runner import EVAL_POOL, evaluate
from spade_async.eval.suites import SHIPPED, Context, make_suite

sys.path.insert(0, str(Path(__file__).parent))
from eval_scripted import Scripted, gold_reply, wrong_reply  # noqa: E402


@pytest.mark.parametrize(
    "limit", [1, pytest.param(8, marks=pytest.mark.slow)]
)  # 8: every BFCL category twice, eight different RG tasks per bucket
def test_gold_scores_one_and_wrong_scores_zero_on_every_shipped_suite(tmp_path, limit):
    LIMIT = limit

    async def main():
        gold = await evaluate(
            list(SHIPPED), Scripted(gold_reply), out=tmp_path, model="gold", limit=LIMIT, n=1
        )
        wrong = await evaluate(
            list(SHIPPED), Scripted(wrong_reply), out=None, model="wrong", limit=LIMIT, n=1
        )
        return gold, wrong

    gold, wrong = anyio.run(main)
    for name in SHIPPED:
        assert gold.suites[name].metrics["avg@1"] == 1.0, name
        assert gold.suites[name].n_problems == LIMIT, name
        assert wrong.suites[name].metrics["avg@1"] == 0.0, name
    rows = [json.loads(x) for x in (tmp_path / "bfcl_v4_multi_turn.jsonl").read_text().splitlines()]
    categories = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                  "multi_turn_long_context"]  # fmt: skip
    assert {r["id"].rsplit("_", 1)[0] for r in rows} == set(categories[:limit])
    # tools reach the model through the chat template (no project system prompt); results as
    # tool messages
    assert all(r["transcript"][0]["role"] == "user" for r in rows)
    assert all(any(m["role"] == "tool" for m in r["transcript"]) for r in rows)
    for name in SHIPPED:
        line = json.loads((tmp_path / f"{name}.jsonl").read_text().splitlines()[0])
        assert {"id", "prompt", "completion", "answer", "extracted", "score"} <= set(line)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["complete"] is True and set(results["suites"]) == set(SHIPPED)


@pytest.mark.parametrize(
    ("gold", "pred", "want"),
    [("0.5", "\\dfrac{1}{2}", True), ("\\frac{1}{2}", "0.5", True), ("70", "70", True),
     ("70", "071", False), ("\\sqrt{2}", "2^{1/2}", True), ("3", "\\text{three}", False),
     ("12", "}{", False)],
)  # fmt: skip
def test_math_verify_in_a_checker_process(gold, pred, want):
    with Checker(workers=1) as checker:
        assert checker.call_sync(math_equal, gold, pred) is want


HOSTILE = {
    "loop": "def {f}(*a, **k):\n    while True:\n        pass\n",
    "system": "import os\ndef {f}(*a, **k):\n    return os.system('touch {marker}')\n",
    "fork": "import os\ndef {f}(*a, **k):\n    return os.fork()\n",
    "exit": "import os\nos._exit(0)\ndef {f}(*a, **k):\n    return None\n",
    "exit_ok": "import sys\nsys.exit(0)\n",
}


def test_hostile_completions_are_contained_and_score_zero(tmp_path):
    suite = make_suite("humaneval")
    item = suite.load(1)[0]
    marker = tmp_path / "pwned"

    async def main():
        async with EnvPool(EVAL_POOL) as pool:
            ctx = Context(Scripted(gold_reply), None, pool, None)
            out = {}
            for name, code in HOSTILE.items():
                completion = (
                    "```python\n" + code.format(f=item.meta["entry_point"], marker=marker) + "```"
                )
                out[name] = await suite.score(item, completion, ctx)
            out["gold"] = await suite.score(item, gold_reply(item, []), ctx)
            # a whole function without the prompt's `from typing import List`: still right
            body = item.meta["canonical"].split(f"def {item.meta['entry_point']}", 1)[1]
            whole = f"```python\ndef {item.meta['entry_point']}{body}```"
            out["whole_function"] = await suite.score(item, whole, ctx)
            return out

    scores = anyio.run(main)
    assert {k: v[1] for k, v in scores.items()} == dict.fromkeys(HOSTILE, 0.0) | {
        "gold": 1.0,
        "whole_function": 1.0,
    }
    assert not marker.exists()


def test_gpqa_from_a_user_file(tmp_path):
    rows = [{"Question": f"Q{i}?", "Correct Answer": "right", "Incorrect Answer 1": "w1",
             "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"} for i in range(6)]  # fmt: skip
    path = tmp_path / "gpqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    suite = make_suite("gpqa_diamond", {"gpqa_diamond": str(path)})
    items = suite.load(0)
    letters = [i.answer for i in items]
    assert len(set(letters)) > 1  # options are shuffled (fixed seed)
    assert letters == [
        i.answer for i in make_suite("gpqa_diamond", {"gpqa_diamond": str(path)}).load(0)
    ]
    for it in items:
        assert f"\n{it.answer}. right\n" in it.messages[0]["content"]  # "A. option", the reference's

    async def score(text):
        return await suite.score(items[0], text, None)

    right = items[0].answer
    assert anyio.run(score, f"\\boxed{{\\text{{{right}}}}}") == (right, 1.0)
    wrong = "A" if right != "A" else "B"
    assert anyio.run(score, f"the answer is ({wrong})") == (wrong, 0.0)


@pytest.mark.parametrize("name", ["gpqa_diamond", "livecodebench", "acebench_agent"])
def test_missing_data_is_one_line_naming_the_file(name, tmp_path):
    with pytest.raises(SpadeError) as err:
        make_suite(name, {name: str(tmp_path / "nope")}).load(0)
    msg = str(err.value)
    assert "\n" not in msg and "expected" in msg


def test_unknown_suite_suggests_the_closest():
    with pytest.raises(SpadeError, match="did you mean 'aime25'"):
        make_suite("aime_25")


def test_more_bfcl_episodes_than_pool_workers_wait_their_turn():
    """6 episodes, a pool of 3 workers that gives up on a slot after 1 s, a slow engine: the
    episodes queue for workers instead of failing as 'busy' (which would score them 0)."""
    from spade_async.envs.pool import PoolConfig

    class Slow(Scripted):
        async def __call__(self, messages, sampling, *, item=None, tools=None) -> str:
            await anyio.sleep(0.4)
            return await super().__call__(messages, sampling, item=item, tools=tools)

    config = PoolConfig(max_workers=3, prewarm=1, capacity_wait_s=1.0)
    res = _in_small_pool(config, "bfcl_v4_multi_turn", Slow(gold_reply), n=1, limit=6)
    assert res.samples == 6 and res.metrics["avg@1"] == 1.0, res.metrics


def _in_small_pool(config, suite: str, generator, *, n: int, limit: int):
    """``suite`` evaluated at a concurrency far above ``config``'s workers."""
    import msgspec

    config = msgspec.structs.replace(config, call_timeout_s=10.0, open_timeout_s=30.0)

    async def main():
        async with EnvPool(config) as pool:
            return await evaluate([suite], generator, out=None, model="g", n=n, limit=limit,
                                  pool=pool, concurrency=32)  # fmt: skip

    return anyio.run(main).suites[suite]


def test_equal_code_samples_each_get_a_worker_of_their_own():
    """k equal completions (a low-temperature model) score together: each runs on its own
    worker, so one finishing (its worker released) never kills another mid-test."""

    async def main():
        return await evaluate(
            ["humaneval"], Scripted(gold_reply), out=None, model="g", limit=2, n=4
        )

    res = anyio.run(main)
    assert res.suites["humaneval"].metrics["avg@4"] == 1.0


def test_more_code_samples_than_pool_workers_queue_instead_of_scoring_zero():
    """12 HumanEval samples, each on a fresh worker of a 2-worker pool that gives up on a
    slot after 0.3 s: the samples still queued wait their turn (``fresh_instance`` holds a
    slot per worker) instead of scoring 0 as 'busy'."""
    from spade_async.envs.pool import PoolConfig

    config = PoolConfig(max_workers=2, prewarm=0, capacity_wait_s=0.3)
    res = _in_small_pool(config, "humaneval", Scripted(gold_reply), n=6, limit=2)
    assert res.samples == 12 and res.metrics["avg@6"] == 1.0, res.metrics
