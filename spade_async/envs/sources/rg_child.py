"""Make reasoning-gym entries in a child interpreter (``PYTHONHASHSEED=0``) for ``rg:``.

reasoning-gym's generators depend on string-hash order, so the entries are made here, with a
fixed hash seed: the same value gives the same problems, byte for byte, in every import.
Each entry becomes plain data (numpy scalars and arrays to Python values); one that does not
survive as a Python literal, whose answer is not text with paired braces, or whose own
answer, given back as ``\\boxed{answer}``, does not score 1.0 with the dataset's own
``score_answer`` on the plain entry, is left out and named in a note.

Reads ``{"names": [...], "seed": S, "size": N}`` as JSON on stdin; writes
``repr({"datasets": {name: [entry, ...]}, "unknown": [...], "notes": [...]})`` to stdout
(the parent reads it with ``ast.literal_eval``: data, never code).
"""

from __future__ import annotations

import ast
import json
import sys
import warnings

from spade_async.envs.sources.answers import balanced, boxed


def plain(x):
    """Python values only: numpy scalars/arrays become numbers/lists; anything else stays."""
    if isinstance(x, dict):
        return {plain(k): plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(plain(v) for v in x)
    if type(x).__module__ == "numpy":
        return plain(x.tolist()) if hasattr(x, "tolist") else x
    return x


def entries(name: str, seed: int, size: int, notes: list[str]) -> list[dict]:
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(name, seed=seed, size=size)
    except Exception as exc:  # a dataset whose config or generator fails: named
        notes.append(f"{name}: cannot be built ({type(exc).__name__}: {str(exc)[:200]})")
        return []
    out = []
    for i in range(size):
        why = None
        try:
            raw = ds[i]
            entry = {
                "question": plain(raw["question"]),
                "answer": plain(raw["answer"]),
                "metadata": plain(raw.get("metadata", {})),
            }
            if not isinstance(entry["question"], str) or not entry["question"].strip():
                why = "no text question"
            elif not isinstance(entry["answer"], str) or not entry["answer"].strip():
                why = "no text answer"
            elif not balanced(entry["answer"]):
                why = "its answer's braces do not pair up inside \\boxed{}"
            elif ast.literal_eval(repr(entry)) != entry:
                why = "not plain data"
            else:
                got = boxed("\\boxed{" + entry["answer"] + "}")
                score = float(ds.score_answer(got, entry))
                if score < 1.0:
                    why = f"its own answer scores {score:g}"
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc)[:120]}"
        if why is None:
            out.append(entry)
        else:
            notes.append(f"{name}[{i}] left out: {why}")
    return out


def main() -> None:
    args = json.loads(sys.stdin.read())
    warnings.simplefilter("ignore")
    from reasoning_gym.factory import DATASETS

    notes: list[str] = []
    unknown = [n for n in args["names"] if n not in DATASETS]
    datasets = {}
    if not unknown:
        for name in args["names"]:
            datasets[name] = entries(name, int(args["seed"]), int(args["size"]), notes)
    result = {"datasets": datasets, "unknown": unknown, "notes": notes, "known": sorted(DATASETS)}
    sys.stdout.write(repr(result))


if __name__ == "__main__":
    main()
