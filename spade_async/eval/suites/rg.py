"""reasoning-gym (offline, PyPI ``reasoning-gym``) at the A.3 hard split, in four buckets.

As the reference evaluates it (facts and sources in ``rg_hard``): the 100 tasks of the RG
paper's App. A.3 split at their "hard" parameters, each a dataset of 500 problems made
with seed 42, 8 episodes per task (reset seeds 0-7 pick the problems), temperature 0.6,
top_p 0.8, top_k 20, min_p 0, 8,192 tokens; one user message in the reference's words; a
win is reward >= 1.0, and the bucket's score is wins over all its episodes (Math 31,
Algorithmic 36, Cognition 24, Logic 9 tasks; with one sample per problem, avg@1 is that
pooled win rate). Notes in the result name only what could not be made here: a hard
parameter the installed reasoning-gym lacks, a task or problem whose generator fails or
overruns, a problem whose own reference answer does not win.

Scoring is reasoning-gym's own ``score_answer`` on the last ``<answer>`` (``\\boxed{}`` as
fallback), run in a checker process with a timeout (``spade_async.eval.checker``), not as an
episode in the environment sandbox, because reasoning-gym cannot be imported there at the
isolation level the pool picks wherever bubblewrap works. Environment code is standard
library only (ENV_CONTRACT.md): a bubblewrap worker sees /usr, the base Python installation
and its own files at /opt/spade, and starts as ``python -I -S``, so the virtual
environment's site-packages (reasoning-gym and its dependencies: sympy, numpy, pycosat,
...) is neither mounted nor on ``sys.path``; an environment that imports reasoning_gym gets
``ModuleNotFoundError`` there (sys.path = /opt/spade + the base library only). At the
weaker ``unshare`` and ``rlimit`` levels the worker is the venv's interpreter and the same
environment imports it and scores in under a second, so an RG episode could only run where
isolation is weakest. Making it an episode everywhere needs the sandbox to bind a trusted
package set read-only into the workers that ask for it (a PoolConfig option, the worker
extending ``sys.path``): a decision about what sandboxed code may reach, left to the
sandbox's owners. The checker process runs trusted library code only (reasoning-gym parsing
and comparing the answer string); nothing model-written is executed.
"""

from __future__ import annotations

import importlib.util
import json
import re

from spade_async.errors import SpadeError
from spade_async.eval.checker import CheckTimeout, rg_score
from spade_async.eval.extract import last_answer_tag
from spade_async.eval.suites.base import Context, Suite
from spade_async.eval.suites.rg_hard import BUCKETS, DATASET_SIZE, EPISODES, SEED, user_prompt
from spade_async.eval.types import Item, Sampling

__all__ = ["BUCKETS", "ReasoningGym"]


_MOVE = re.compile(r"(\d*)([A-Z])(w?)('?)")


def _undo_scramble(scramble: str) -> str:
    """Moves that undo a rubiks_cube scramble, in the notation its scorer reads: it drops
    layer-prefixed moves, so slice ``2R`` is written ``Rw R'`` and ``1Rw`` is ``R``."""
    out: list[str] = []
    for move in reversed(scramble.split()):
        m = _MOVE.fullmatch(move)
        if m is None:
            return ""
        layer, face, wide, prime = m.groups()
        undo, redo = ("", "'") if prime else ("'", "")
        if layer == "1" or (not layer and not wide):
            out.append(face + undo)
        elif wide and layer in ("", "2"):
            out.append(f"{face}w{undo}")
        elif layer == "2":
            out += [f"{face}w{undo}", face + redo]
        else:
            return ""
    return " ".join(out)


def _gold(entry: dict) -> str:
    """The reference answer; tasks with many right answers carry one as ``example_answer``."""
    if entry.get("answer") is not None:
        return str(entry["answer"])
    meta = entry.get("metadata", {})
    for key in ("example_answer", "example_correct_answer", "possible_answer"):
        if meta.get(key) not in (None, ""):
            value = meta[key]
            return json.dumps(value) if isinstance(value, dict) else str(value)
    if meta.get("scramble_moves"):  # rubiks_cube solves only 3x3 itself; the hard cube is 5x5
        return _undo_scramble(meta["scramble_moves"])
    return ""  # rush_hour: no reference solution ships with the entry


class ReasoningGym(Suite):
    sampling = Sampling(n=1, temperature=0.6, top_p=0.8, top_k=20, min_p=0.0, max_tokens=8192)
    majority = False  # free-form answers: equal strings are not the only right ones

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.name = f"rg_{bucket}"
        self.notes: list[str] = []

    def load(self, limit: int) -> list[Item]:
        if importlib.util.find_spec("reasoning_gym") is None:
            raise SpadeError(
                f"suite {self.name} needs reasoning-gym: pip install 'spade-async[eval]' "
                "(or make install)"
            )
        from spade_async.eval.suites.rg_gen import generate

        rows, notes, params = generate(BUCKETS[self.bucket], EPISODES, SEED, limit)
        self.notes = list(notes)
        return [
            Item(
                id=f"{r['task']}/{r['episode']}",
                messages=[{"role": "user", "content": user_prompt(r["entry"]["question"])}],
                answer=_gold(r["entry"]),
                meta={"task": r["task"], "index": r["index"], "params": params[r["task"]],
                      "entry": r["entry"]},
            )
            for r in rows
        ]  # fmt: skip

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        answer = last_answer_tag(completion)
        if answer is None:
            return None, 0.0
        meta = item.meta
        try:
            reward = await ctx.checker.call(
                rg_score, meta["task"], SEED, DATASET_SIZE, meta["params"], meta["entry"], answer
            )
        except CheckTimeout:
            reward = 0.0
        return answer, 1.0 if reward >= 1.0 else 0.0
