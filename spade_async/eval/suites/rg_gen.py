"""Generate reasoning-gym entries at the A.3 hard split in a child process (``PYTHONHASHSEED=0``).

reasoning-gym's generators depend on string-hash order (the same seed gives another
polynomial in another process), so entries are made in a child interpreter with a fixed
hash seed: the same problems every run, and re-scoring sees the problems that were asked.
Each task's dataset is built as the reference builds it (``rg_hard``: its hard parameters,
seed 42, 500 problems) and episode ``e`` is problem ``episode_index(e)``. A hard parameter
that the installed reasoning-gym's config class lacks is left out with a note; a task whose
dataset cannot be built, or a problem whose generator runs past ``ENTRY_BUDGET_S`` (the
generator searches; at number_sequence's hard setting one problem takes minutes), is
skipped with a note. A problem whose own reference answer does not score 1.0 (jugs at the
hard setting sometimes has "No solution") stays, as in the reference, and is named in a note.
Run as ``python -m spade_async.eval.suites.rg_gen TASK,TASK,... EPISODES SEED LIMIT``; it
writes a pickle of ``(items, notes, params)`` to stdout (trusted: our own child process).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import pickle
import signal
import subprocess
import sys
import warnings
from typing import Any

from spade_async.errors import SpadeError
from spade_async.eval.suites.rg_hard import DATASET_SIZE, HARD, episode_index

__all__ = ["generate", "ENTRY_BUDGET_S"]

ENTRY_BUDGET_S = 60


@functools.lru_cache(maxsize=16)  # in-loop evaluation loads the same problems every interval
def _generate(tasks: tuple[str, ...], episodes: int, seed: int, limit: int) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    argv = [sys.executable, "-m", __name__, ",".join(tasks), str(episodes), str(seed), str(limit)]
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=1800)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise SpadeError(f"reasoning-gym could not generate problems: {tail[0]}")
    return proc.stdout


def generate(
    tasks: list[str], episodes: int, seed: int, limit: int
) -> tuple[list[dict], list[str], dict[str, dict[str, Any]]]:
    """``(rows, notes, params)``: rows ``{task, index, episode, entry}``, ``params`` the hard
    parameters applied per task; reasoning-gym is imported only in the child."""
    return pickle.loads(_generate(tuple(tasks), episodes, seed, limit))


class _Overrun(BaseException):  # not an Exception: generators' retry loops must not eat it
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Overrun


def applicable(task: str, config_cls: type) -> tuple[dict[str, Any], list[str]]:
    """The hard parameters ``config_cls`` knows, and one note per name it lacks."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    params = {k: v for k, v in HARD.get(task, {}).items() if k in names}
    notes = [
        f"task {task}: hard parameter {k}={v!r} is not in the installed reasoning-gym's "
        f"{config_cls.__name__}; left at its default"
        for k, v in HARD.get(task, {}).items() if k not in names
    ]  # fmt: skip
    return params, notes


def _dataset(task: str, seed: int, notes: list[str], params: dict) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        notes.append(f"task {task} skipped: the installed reasoning-gym has no such task")
        return None
    kwargs, missing = applicable(task, DATASETS[task][1])
    notes += missing
    try:
        ds = reasoning_gym.create_dataset(task, seed=seed, size=DATASET_SIZE, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a broken generator skips its task
        notes.append(f"task {task} skipped: {type(exc).__name__}: {exc}"[:200])
        return None
    params[task] = kwargs
    return ds


def _entry(task: str, ds: Any, ep: int, notes: list[str]) -> dict | None:
    index = episode_index(ep)
    signal.alarm(ENTRY_BUDGET_S)
    try:
        entry = ds[index]
    except _Overrun:
        notes.append(f"task {task} episode {ep} (problem {index}) skipped: its generator ran "
                     f"past {ENTRY_BUDGET_S} s")  # fmt: skip
        return None
    except Exception as exc:  # noqa: BLE001 - a broken generator skips its problem
        notes.append(f"task {task} episode {ep} skipped: {type(exc).__name__}: {exc}"[:200])
        return None
    finally:
        signal.alarm(0)
    answer = entry.get("answer")
    try:
        own = 1.0 if answer is None else float(ds.score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - a scorer that rejects its own answer
        own = 0.0
    if own < 1.0:
        notes.append(f"task {task} episode {ep}: reasoning-gym's own answer {str(answer)[:40]!r} "
                     f"scores {own:g}; the problem may be unwinnable")  # fmt: skip
    return entry


def _main(tasks: list[str], episodes: int, seed: int, limit: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import reasoning_gym  # noqa: F401 - slow import, once

        gc.collect()
    signal.signal(signal.SIGALRM, _alarm)
    out: list[dict] = []
    notes: list[str] = []
    params: dict[str, dict[str, Any]] = {}
    datasets: dict = {}
    # interleaved (task 1 ep 0, task 2 ep 0, ...) so a limit still spans tasks
    for ep in range(episodes):
        for task in tasks:
            if limit and len(out) >= limit:
                return out, notes, params
            if task not in datasets:
                datasets[task] = _dataset(task, seed, notes, params)
            if datasets[task] is None:
                continue
            entry = _entry(task, datasets[task], ep, notes)
            if entry is not None:
                row = {"task": task, "index": episode_index(ep), "episode": ep, "entry": entry}
                out.append(row)
    return out, notes, params


if __name__ == "__main__":
    real_stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # generators that print must not corrupt the pickle
    result = _main(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    real_stdout.write(pickle.dumps(result))
