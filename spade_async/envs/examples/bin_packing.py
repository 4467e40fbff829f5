"""Online bin packing: pack arriving parcels into as few crates as possible.

Skill: Optimization. Setting: games.

Eight parcels arrive one at a time; the agent sees the current parcel and the next two,
and puts the current one into an open crate or a new one (capacity 10, no overflow).
Using the fewest crates possible for the whole sequence (the offline optimum) scores 1.0;
otherwise the score is half of optimum / crates used. Greedy first-fit needs an extra
crate in about one episode in five, so the lookahead matters.

Action: \\boxed{put 2}   (crate number; one past the last crate opens a new crate)
"""

import random
import re

CAPACITY = 10


def best_plan(loads, items):
    """Crate index for each remaining item, minimising the final crate count (search)."""
    best = [None, len(loads) + len(items) + 1]

    def search(loads, i, plan):
        if len(loads) >= best[1]:
            return
        if i == len(items):
            best[0], best[1] = list(plan), len(loads)
            return
        for k in range(len(loads) + 1):
            if k == len(loads):
                search(loads + [items[i]], i + 1, plan + [k])
            elif loads[k] + items[i] <= CAPACITY:
                search(loads[:k] + [loads[k] + items[i]] + loads[k + 1:], i + 1, plan + [k])

    search(list(loads), 0, [])
    return best[0]


class BinPackingEnv:
    def __init__(self, n_items=8, max_turns=16, **kwargs):
        self.n_items = n_items
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.items = [rng.randint(2, 7) for _ in range(self.n_items)]
        self.optimum = len(set(best_plan([], self.items)))
        self.loads = []
        self.next = 0
        self.turn = 0
        self.done = False
        intro = (f"Pack {self.n_items} parcels into crates of capacity {CAPACITY}, in arrival "
                 "order, using as few crates as possible. \\boxed{put k} puts the current parcel "
                 "into crate k; k = (number of crates + 1) opens a new crate.\n")
        return intro + self._view(), {}

    def _view(self):
        crates = ", ".join(f"#{k + 1}:{load}/{CAPACITY}" for k, load in enumerate(self.loads)) or "none"
        upcoming = self.items[self.next:self.next + 3]
        return (f"Crates: {crates}. Current parcel: {upcoming[0]}. "
                f"Next: {upcoming[1:] or 'nothing'}.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{\s*put\s+(\d+)\s*\}", (action or "").lower())
        reward, terminated = 0.0, False
        k = int(match.group(1)) - 1 if match else -1
        size = self.items[self.next]
        if not 0 <= k <= len(self.loads):
            obs = f"Invalid. Use \\boxed{{put k}} with 1 <= k <= {len(self.loads) + 1}. " + self._view()
        elif k < len(self.loads) and self.loads[k] + size > CAPACITY:
            obs = f"Parcel {size} does not fit in crate #{k + 1}. " + self._view()
        else:
            if k == len(self.loads):
                self.loads.append(0)
            self.loads[k] += size
            self.next += 1
            if self.next < len(self.items):
                obs = self._view()
            else:
                terminated, used = True, len(self.loads)
                reward = 1.0 if used <= self.optimum else round(0.5 * self.optimum / used, 3)
                obs = f"All packed in {used} crates; the best possible was {self.optimum}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Out of turns."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"crates": len(self.loads)}

    def solution(self):
        plan = best_plan(self.loads, self.items[self.next:])
        return [f"\\boxed{{put {k + 1}}}" for k in plan]
