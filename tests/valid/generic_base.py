"""A valid file at the contract's edge: an abstract ``Generic`` base class whose name ends in
Env and which defines reset/step, and the one concrete environment subclassing it through
a subscripted base (``_CounterEnv[int]``). Exactly one concrete ...Env class."""

import random
import re
from typing import Generic, TypeVar

T = TypeVar("T")


class _CounterEnv(Generic[T]):
    """Shared turn bookkeeping; abstract (``target`` comes from the subclass)."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.turn, self.value = 0, 0
        self.target = self.pick_target()
        return self.describe(), {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{add (\d)\}", action)
        if m:
            self.value += int(m.group(1))
        won = self.value == self.target
        over = self.value > self.target
        done = won or over
        trunc = not done and self.turn >= self.max_turns
        return f"value={self.value}", (1.0 if won else 0.0), done, trunc, {}

    def pick_target(self) -> T:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class SumToTargetEnv(_CounterEnv[int]):
    """Reach the hidden target exactly; each turn \\boxed{add k} with 1 <= k <= 9."""

    def pick_target(self) -> int:
        return self.rng.randint(12, 30)

    def describe(self) -> str:
        return (
            f"Reach exactly {self.target} from 0 with \\boxed{{add k}} (1 <= k <= 9); "
            "going over loses."
        )

    def solution(self):
        moves, left = [], self.target
        while left:
            k = min(9, left)
            moves.append(f"\\boxed{{add {k}}}")
            left -= k
        return moves
