"""reasoning-gym (offline, PyPI ``reasoning-gym``) at the A.3 hard split, in four buckets.

As the reference evaluates it (facts and sources in ``rg_hard``): the 100 tasks of the RG
paper's App. A.3 split at their "hard" parameters, each a dataset of 500 problems made
with seed 42, 8 episodes per task (reset seeds 0-7 pick the problems), temperature 0.6,
top_p 0.8, top_k 20, min_p 0, 8,192 tokens; one user message in the reference's words (it
asks for ``<answer>`` and ``\\boxed{}``); the answer is the last ``<answer>`` that holds one
(``<answer>\\boxed{2}</answer>`` is 2; an empty tag or an echo of the prompt's
"<answer>answer here</answer>" placeholder is skipped), else the last ``\\boxed{}``, as the
reference's adapter falls back; reasoning-gym's strict ``score_answer`` judges it; a
win is reward >= 1.0, and the bucket's score is wins over all its episodes (Math 31,
Algorithmic 36, Cognition 24, Logic 9 tasks; with one sample per problem, avg@1 is that
pooled win rate). Notes in the result name only what could not be made here: a hard
parameter the installed reasoning-gym lacks, a task or problem whose generator fails or
overruns, a problem whose own reference answer does not win.

Each answer is played as an episode through the environment interface, the path training
environments take: ``rg_env.SOURCE`` in a sandbox pool (reset shows the problem, one step
scores the answer with reasoning-gym's own ``score_answer``). Environment code is standard
library only (docs/environments.md), so this pool is a separate one whose workers also see
reasoning-gym and its requirements, bound read-only (``PoolConfig.packages``); the pool of
code and tool-use episodes, and training's, stay standard library only. Every episode gets
a fresh worker: some scorers evaluate the answer as Python (countdown's ``parse_expr``).
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import re

from spade_async.envs.process import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.extract import last_answer_tag
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.suites.rg_env import SOURCE
from spade_async.eval.suites.rg_hard import BUCKETS, DATASET_SIZE, EPISODES, SEED, user_prompt
from spade_async.eval.types import Item, Sampling

__all__ = ["BUCKETS", "ReasoningGym", "play_episode"]


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
    packages = ("reasoning-gym",)  # imported by its environment (rg_env) in the sandbox

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
        reward = await play_episode(ctx, item, answer)
        return answer, 1.0 if reward >= 1.0 else 0.0


async def play_episode(ctx: Context, item: Item, answer: str) -> float:
    """One episode of ``rg_env.SOURCE`` on a fresh worker of the package pool: reset, one
    step with the answer. Some scorers evaluate the answer (countdown hands it to sympy's
    ``parse_expr``), so it is model-written code: a worker of its own keeps it from the
    host and from every other episode's verdict. A timeout or crash scores 0."""
    if ctx.package_pool is None:
        raise SpadeError("reasoning-gym episodes need Context.package_pool (runner.evaluate)")
    meta = item.meta
    kwargs = {"task": meta["task"], "params": meta["params"], "entry": pickle.dumps(meta["entry"]),
              "seed": SEED, "size": DATASET_SIZE}  # fmt: skip
    try:
        async with fresh_instance(ctx.package_pool, SOURCE, "rg", kwargs) as inst:
            _, reward, *_ = await ctx.package_pool.step(inst, answer)
            return reward
    except EnvError:
        return 0.0
