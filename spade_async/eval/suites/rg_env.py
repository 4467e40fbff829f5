"""Environment source for one reasoning-gym problem, played in the sandbox pool.

Trusted code of ours, not model-written: it imports reasoning-gym, which the pool binds
read-only into its workers (``PoolConfig.packages``; generated environments stay standard
library only). ``reset`` shows the problem; one ``step`` with the extracted answer scores it
with reasoning-gym's own ``score_answer`` and ends the episode. The problem itself (the
entry) is made outside, in a child with a fixed hash seed (``rg_gen``), and passed in:
reasoning-gym's generators depend on string-hash order, which ``python -I`` cannot fix.
It travels pickled, parent to sandbox only (our own data): its scorers compare tuples,
grids and ``numpy.str_`` values that a JSON or msgpack round trip would change.
Datasets are cached per worker, so a worker pays reasoning-gym's import and each task's
dataset once, however many episodes it serves.
"""

SOURCE = r"""
import json
import pickle

import reasoning_gym

_DATASETS = {}


def _dataset(task, seed, size, params):
    key = (task, seed, size, json.dumps(params, sort_keys=True))
    if key not in _DATASETS:
        _DATASETS[key] = reasoning_gym.create_dataset(task, seed=seed, size=size, **params)
    return _DATASETS[key]


class ReasoningGymEnv:
    def __init__(self, task, params, entry, seed=42, size=500, max_turns=1, **kwargs):
        self.entry = pickle.loads(entry)
        self.max_turns = max_turns
        self.dataset = _dataset(task, seed, size, params)

    def reset(self, seed=None):
        return self.entry["question"], {}

    def step(self, action):
        try:
            reward = float(self.dataset.score_answer(action, self.entry))
        except Exception as e:  # a scorer crash on a malformed answer scores 0
            return f"scorer failed: {type(e).__name__}", 0.0, True, False, {}
        return "scored", reward, True, False, {}

    def solution(self):
        return ""
"""
