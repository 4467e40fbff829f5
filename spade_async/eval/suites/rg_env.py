"""Environment source for one reasoning-gym problem, played in the sandbox pool.

Our own code, not model-written: it imports reasoning-gym, which the pool binds
read-only into its workers (``PoolConfig.packages``; generated environments stay standard
library only). ``reset`` shows the problem; one ``step`` with the extracted answer scores it
with reasoning-gym's own ``score_answer`` and ends the episode. The problem itself (the
entry) is made outside, in a child with a fixed hash seed (``rg_gen``), and passed in:
reasoning-gym's generators depend on string-hash order, which ``python -I`` cannot fix.
It travels pickled, parent to sandbox only (our own data): its scorers compare tuples,
grids and ``numpy.str_`` values that a JSON or msgpack round trip would change.

The answer is not always data only: countdown's scorer evaluates it with sympy's
``parse_expr``. So every episode has a worker of its own (``fresh_instance``),
paying reasoning-gym's import (about 1 s of CPU) each time.
"""

SOURCE = r"""
import pickle

import reasoning_gym


class ReasoningGymEnv:
    def __init__(self, task, params, entry, seed=42, size=500, max_turns=1, **kwargs):
        self.entry = pickle.loads(entry)
        self.max_turns = max_turns
        self.dataset = reasoning_gym.create_dataset(task, seed=seed, size=size, **params)

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
