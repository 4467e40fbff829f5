"""Switchboard: discover hidden wiring by intervening, then light a target pattern.

Skill: Causal_Inference. Setting: games.

Four switches drive four lamps through hidden wiring: each lamp is lit when an odd number
of the switches wired to it are on (XOR). All switches start off, so all lamps start off.
Toggling one switch at a time is a clean intervention that reveals which lamps it
affects; the goal is to make the lamps show a target pattern. Reaching it scores 1.0;
running out of turns scores half the fraction of lamps that match.

Action: \\boxed{toggle 3}
"""

import random
import re

N = 4


class SwitchboardEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        # wiring[j] = the switches that feed lamp j; every switch feeds at least one lamp
        while True:
            self.wiring = [set(rng.sample(range(N), rng.randint(1, 2))) for _ in range(N)]
            if set().union(*self.wiring) == set(range(N)):
                break
        while True:  # a target that needs at least two toggles to reach
            self.plan = sorted(rng.sample(range(N), rng.randint(2, 3)))
            self.target = self._lamps(set(self.plan))
            single = [self._lamps({i}) for i in range(N)]
            if any(self.target) and self.target not in single:
                break
        self.switches = set()
        self.turn = 0
        self.done = False
        obs = (f"{N} switches (1-{N}) control {N} lamps through hidden wiring. All are off. "
               f"Target lamps: {self._show(self.target)}. Flip a switch with \\boxed{{toggle k}}.\n"
               + self._status())
        return obs, {}

    def _lamps(self, switches):
        return [len(feeds & switches) % 2 for feeds in self.wiring]

    @staticmethod
    def _show(lamps):
        return " ".join("ON" if on else "off" for on in lamps)

    def _status(self):
        on = ", ".join(str(s + 1) for s in sorted(self.switches)) or "none"
        return f"Switches on: {on}. Lamps: {self._show(self._lamps(self.switches))}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{\s*toggle\s+(\d+)\s*\}", (action or "").lower())
        reward, terminated = 0.0, False
        k = int(match.group(1)) - 1 if match else -1
        if not 0 <= k < N:
            obs = f"Invalid. Use \\boxed{{toggle k}} with 1 <= k <= {N}. " + self._status()
        else:
            self.switches ^= {k}
            obs = self._status()
            if self._lamps(self.switches) == self.target:
                obs += " The target pattern is lit!"
                reward, terminated = 1.0, True
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            matching = sum(a == b for a, b in zip(self._lamps(self.switches), self.target))
            reward = round(0.5 * matching / N, 3)
            obs += " Out of turns."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"switches_on": sorted(self.switches)}

    def solution(self):
        flips = sorted(self.switches.symmetric_difference(self.plan))
        return [f"\\boxed{{toggle {k + 1}}}" for k in flips]
