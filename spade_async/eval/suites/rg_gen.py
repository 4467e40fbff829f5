"""Generate reasoning-gym entries in a child process with ``PYTHONHASHSEED=0``.

reasoning-gym's generators depend on string-hash order (the same seed gives another
polynomial in another process), so entries are made in a child interpreter with a fixed
hash seed: the same problems every run, and re-scoring sees the problems that were asked.
Run as ``python -m spade_async.eval.suites.rg_gen TASK,TASK,... EPISODES SEED LIMIT``; it
writes a pickle of ``(items, notes, system_prompt)`` to stdout (trusted: our own child process).
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import subprocess
import sys
import warnings

from spade_async.errors import SpadeError

__all__ = ["generate"]


@functools.lru_cache(maxsize=16)  # in-loop evaluation loads the same problems every interval
def _generate(tasks: tuple[str, ...], episodes: int, seed: int, limit: int) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    argv = [sys.executable, "-m", __name__, ",".join(tasks), str(episodes), str(seed), str(limit)]
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=600)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise SpadeError(f"reasoning-gym could not generate problems: {tail[0]}")
    return proc.stdout


def generate(
    tasks: list[str], episodes: int, seed: int, limit: int
) -> tuple[list[dict], list[str], str]:
    """``(entries, notes, system_prompt)``; reasoning-gym is imported only in the child."""
    return pickle.loads(_generate(tuple(tasks), episodes, seed, limit))


def _main(
    tasks: list[str], episodes: int, seed: int, limit: int
) -> tuple[list[dict], list[str], str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import reasoning_gym
        from reasoning_gym.utils import SYSTEM_PROMPTS

        gc.collect()
    system = SYSTEM_PROMPTS["default"]
    out: list[dict] = []
    notes: list[str] = []
    datasets: dict = {}
    # interleaved (task 1 ep 0, task 2 ep 0, ...) so a limit still spans tasks
    for ep in range(episodes):
        for task in tasks:
            if limit and len(out) >= limit:
                return out, notes, system
            if task not in datasets:
                try:
                    datasets[task] = reasoning_gym.create_dataset(task, seed=seed, size=episodes)
                except Exception as exc:  # noqa: BLE001 - a broken generator skips its task
                    datasets[task] = None
                    notes.append(f"task {task} skipped: {type(exc).__name__}: {exc}"[:200])
            if datasets[task] is not None:
                out.append({"task": task, "index": ep, "entry": datasets[task][ep]})
    return out, notes, system


if __name__ == "__main__":
    real_stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # generators that print must not corrupt the pickle
    result = _main(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    real_stdout.write(pickle.dumps(result))
