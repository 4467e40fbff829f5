"""``rg:NAME[,NAME...]`` -- reasoning-gym datasets as environments of ours.

Options: ``size`` (entries made per dataset, default 100), ``seed`` (the dataset seed,
default 42), ``per_env`` (entries per environment, default all of them: one environment per
dataset), ``attempts`` (answers the agent may give, default 1, as reasoning-gym asks).

The entries are made outside the sandbox, in a child with a fixed hash seed (``rg_child``),
and written into the environment source as one literal (``ENTRIES``). The environment's
``reset(seed)`` shows entry ``seed % len(ENTRIES)`` (one task per seed); ``step`` reads the
reply's last ``\\boxed{...}`` and scores it with reasoning-gym's own ``score_answer`` (the
reward; the episode ends at 1.0 or when the attempts are spent); ``solution()`` is the
dataset's own answer, boxed. The source imports reasoning-gym inside the worker, so the pool
binds it (``envs.packages = ["reasoning-gym"]``).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import os
import subprocess
import sys

from spade_async.envs.sources import (
    Item,
    Source,
    SourceError,
    check_options,
    class_name,
    int_option,
    literal,
    require,
)
from spade_async.envs.sources.answers import boxed

GEN_TIMEOUT_S = 600

_CLASS = '''

class {cls}:
    """One reasoning-gym task per seed, scored by reasoning-gym itself."""

    def __init__(self, max_turns=ATTEMPTS, **kwargs):
        self.max_turns = max(1, int(max_turns))
        self._score = reasoning_gym.create_dataset(
            DATASET, seed=DATASET_SEED, size=DATASET_SIZE
        ).score_answer
        self.index, self.turn, self.done = 0, 0, False

    def reset(self, seed=None):
        self.index = (0 if seed is None else int(seed)) % len(ENTRIES)
        self.turn, self.done = 0, False
        entry = ENTRIES[self.index]
        tries = "" if self.max_turns == 1 else f" You have {{self.max_turns}} attempts."
        prompt = entry["question"] + "\\n\\nGive your final answer as \\\\boxed{{...}}." + tries
        return prompt, {{"dataset": DATASET, "index": self.index}}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {{}}
        self.turn += 1
        answer = boxed(str(action))
        score, note = 0.0, ""
        if answer is None:
            note = "No \\\\boxed{{...}} answer found."
        else:
            try:
                score = float(self._score(answer, ENTRIES[self.index]))
            except Exception as exc:  # a scorer that fails on a malformed answer scores 0
                score, note = 0.0, f"The answer could not be scored ({{type(exc).__name__}})."
        if not 0.0 <= score <= 1.0:
            score = 0.0 if score != score or score < 0.0 else 1.0
        info = {{"dataset": DATASET, "index": self.index, "score": score}}
        if score >= 1.0:
            self.done = True
            return "Correct.", 1.0, True, False, info
        if self.turn >= self.max_turns:
            self.done = True
            return (note + " Not fully correct; the episode is over.").strip(), score, True, False, info
        left = self.max_turns - self.turn
        return (note + f" Not correct. {{left}} attempt(s) left.").strip(), 0.0, False, False, info

    def solution(self):
        return ["\\\\boxed{{" + ENTRIES[self.index]["answer"] + "}}"]
'''


def source(dataset: str, entries: list[dict], *, origin: str, seed: int, size: int,
           attempts: int) -> str:  # fmt: skip
    head = [
        '"""reasoning-gym dataset, imported by spade-async (spade_async/envs/sources/rg.py).',
        "",
        "One task per seed; reasoning-gym's own score_answer is the reward; solution() is the",
        'dataset\'s own answer. Every value below is a literal written by the importer."""',
        "",
        "import reasoning_gym",
        "",
        f"SKILL = {literal(('rg-' + dataset)[:200])}",
        f"ORIGIN = {literal(origin)}",
        f"DATASET = {literal(dataset)}",
        f"DATASET_SEED = {literal(seed)}",
        f"DATASET_SIZE = {literal(size)}",
        f"ATTEMPTS = {literal(attempts)}",
        f"ENTRIES = {literal(entries)}",
        "",
        "",
        inspect.getsource(boxed).rstrip(),
    ]
    return "\n".join(head) + "\n" + _CLASS.format(cls=class_name(dataset))


def generate(value: str, names: list[str], seed: int, size: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"PYTHONHASHSEED": "0"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spade_async.envs.sources.rg_child"],
            input=json.dumps({"names": names, "seed": seed, "size": size}),
            capture_output=True, text=True, timeout=GEN_TIMEOUT_S, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SourceError(
            f"{value!r}: reasoning-gym took over {GEN_TIMEOUT_S} s to make the entries; "
            "ask for fewer (size=N) or other datasets"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise SourceError(f"{value!r}: reasoning-gym failed making the entries: {last}")
    return ast.literal_eval(proc.stdout)


def items(src: Source) -> tuple[list[Item], list[str]]:
    check_options(src, {"size", "seed", "per_env", "attempts"})
    size = int_option(src, "size", 100, 1, 100_000)
    seed = int_option(src, "seed", 42, 0, 2**31 - 1)
    per_env = int_option(src, "per_env", size, 1, 100_000)
    attempts = int_option(src, "attempts", 1, 1, 20)
    names = [n.strip() for n in src.target.split(",") if n.strip()]
    require(src.value, "reasoning_gym", install="reasoning-gym")
    out = generate(src.value, names, seed, size)
    if out["unknown"]:
        bad = out["unknown"][0]
        near = difflib.get_close_matches(bad, out["known"], n=3)
        raise SourceError(
            f"{src.value!r}: reasoning-gym has no dataset {bad!r}; "
            + (f"did you mean {', '.join(near)}? " if near else "")
            + "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))' lists them"
        )
    result: list[Item] = []
    for name in names:
        entries = out["datasets"].get(name, [])
        for lo in range(0, len(entries), per_env):
            chunk = entries[lo : lo + per_env]
            extra = "" if attempts == 1 else f"&attempts={attempts}"
            origin = f"rg:{name}?seed={seed}&size={size}{extra}#{lo}:{lo + len(chunk)}"
            code = source(name, chunk, origin=origin, seed=seed, size=size, attempts=attempts)
            result.append(Item(code=code, origin=origin, skill=f"rg-{name}"[:200]))
    return result, list(out["notes"])
