"""Fog maze: walk out of a maze you can only see one cell around you.

Skill: Spatial_Reasoning. Setting: games.

A perfect maze (exactly one path between any two cells) on a 5x5 grid of rooms. The agent
starts in the north-west room and must reach the south-east exit, seeing only which walls
surround the room it stands in. Keeping a mental map of explored corridors is the whole
game. Reaching the exit scores 1.0; running out of moves scores up to 0.5 for the progress
made toward the exit (measured along the maze).

Action: \\boxed{north} / \\boxed{south} / \\boxed{east} / \\boxed{west}
"""

import random
import re
from collections import deque

MOVES = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}


class FogMazeEnv:
    def __init__(self, size=5, max_turns=60, **kwargs):
        self.size = size
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        n = self.size
        self.open = {(r, c): set() for r in range(n) for c in range(n)}
        stack, seen = [(0, 0)], {(0, 0)}
        while stack:  # randomised depth-first search carves a perfect maze
            r, c = stack[-1]
            nexts = [(d, (r + dr, c + dc)) for d, (dr, dc) in MOVES.items()
                     if (r + dr, c + dc) in self.open and (r + dr, c + dc) not in seen]
            if not nexts:
                stack.pop()
                continue
            d, cell = rng.choice(nexts)
            self.open[(r, c)].add(d)
            self.open[cell].add({"north": "south", "south": "north", "east": "west", "west": "east"}[d])
            seen.add(cell)
            stack.append(cell)
        self.pos, self.goal = (0, 0), (n - 1, n - 1)
        self.start_distance = len(self._path(self.pos))
        self.turn = 0
        self.done = False
        intro = (f"You are in the north-west room of a {n}x{n} maze; the exit is in the "
                 f"south-east room. Move with \\boxed{{north|south|east|west}}. ")
        return intro + self._view(), {}

    def _path(self, start):
        """Moves of the shortest path from `start` to the goal (breadth-first search)."""
        prev, queue = {start: None}, deque([start])
        while queue:
            cell = queue.popleft()
            for d in self.open[cell]:
                nxt = (cell[0] + MOVES[d][0], cell[1] + MOVES[d][1])
                if nxt not in prev:
                    prev[nxt] = (cell, d)
                    queue.append(nxt)
        moves, cell = [], self.goal
        while prev[cell] is not None:
            cell, d = prev[cell]
            moves.append(d)
        return moves[::-1]

    def _view(self):
        doors = ", ".join(sorted(self.open[self.pos])) or "none"
        return f"Room (row {self.pos[0]}, col {self.pos[1]}). Open doors: {doors}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        move = match.group(1).strip().lower() if match else ""
        reward, terminated = 0.0, False
        if move not in MOVES:
            obs = "Unknown move. Use north, south, east or west. " + self._view()
        elif move not in self.open[self.pos]:
            obs = f"A wall blocks the way {move}. " + self._view()
        else:
            self.pos = (self.pos[0] + MOVES[move][0], self.pos[1] + MOVES[move][1])
            obs = self._view()
            if self.pos == self.goal:
                obs, reward, terminated = "You step through the exit. Free!", 1.0, True
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            remaining = len(self._path(self.pos))
            reward = round(0.5 * (1 - remaining / self.start_distance), 3)
            obs += " You are out of moves."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"position": list(self.pos)}

    def solution(self):
        return [f"\\boxed{{{d}}}" for d in self._path(self.pos)]
