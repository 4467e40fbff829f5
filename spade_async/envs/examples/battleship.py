"""Battleship: sink a hidden fleet on a 6x6 grid with a limited number of shots.

Skill: Spatial_Reasoning. Setting: games.

Three ships (lengths 3, 2 and 2) lie horizontally or vertically on a 6x6 grid, never
overlapping. Each shot reports miss, hit or sunk; a hit means the rest of that ship lies
along a row or a column from it. Sinking the fleet scores 1.0; running out of shots scores
half the fraction of ship cells hit.

Action: \\boxed{fire C4}   (row letter A-F, column 1-6)
"""

import random
import re

ROWS = "ABCDEF"


class BattleshipEnv:
    def __init__(self, max_turns=24, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.ships, taken = [], set()
        for length in (3, 2, 2):
            while True:
                horizontal = rng.random() < 0.5
                r = rng.randrange(6 if horizontal else 7 - length)
                c = rng.randrange(7 - length if horizontal else 6)
                cells = [(r, c + i) if horizontal else (r + i, c) for i in range(length)]
                if not taken.intersection(cells):
                    break
            taken.update(cells)
            self.ships.append(cells)
        self.shots = {}
        self.turn = 0
        self.done = False
        obs = ("Enemy fleet: one ship of length 3 and two of length 2 on a 6x6 grid (rows A-F, "
               f"columns 1-6). Fire with \\boxed{{fire C4}}. You have {self.max_turns} shots.\n")
        return obs + self._board(), {}

    def _board(self):
        lines = ["  " + " ".join(str(c + 1) for c in range(6))]
        for r in range(6):
            lines.append(ROWS[r] + " " + " ".join(self.shots.get((r, c), ".") for c in range(6)))
        return "\n".join(lines)

    def _hit_cells(self):
        return sum(1 for mark in self.shots.values() if mark == "X")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{\s*fire\s+([A-Fa-f])\s*([1-6])\s*\}", action or "")
        reward, terminated = 0.0, False
        if not match:
            obs = "Invalid shot. Use \\boxed{fire C4}."
        else:
            cell = (ROWS.index(match.group(1).upper()), int(match.group(2)) - 1)
            ship = next((s for s in self.ships if cell in s), None)
            self.shots[cell] = "X" if ship else "o"
            if ship is None:
                obs = "Miss."
            elif all(self.shots.get(c) == "X" for c in ship):
                obs = f"Hit - you sank a ship of length {len(ship)}!"
            else:
                obs = "Hit!"
            if self._hit_cells() == sum(len(s) for s in self.ships):
                obs, reward, terminated = "Hit - the whole fleet is sunk. Victory!", 1.0, True
            obs += "\n" + self._board()
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            reward = round(0.5 * self._hit_cells() / sum(len(s) for s in self.ships), 3)
            obs += "\nOut of shots."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"shots": len(self.shots)}

    def solution(self):
        cells = [c for ship in self.ships for c in ship if self.shots.get(c) != "X"]
        return [f"\\boxed{{fire {ROWS[r]}{c + 1}}}" for r, c in cells]
