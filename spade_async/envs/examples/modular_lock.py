"""Modular lock: recover a hidden number from its remainders (Chinese remainder theorem).

Skill: Mathematical_Reasoning. Setting: games.

A lock hides a number N below M = p1 * p2 * p3 (three distinct small primes). Each turn
the agent may ask for N mod p for one of the three primes, or try to open the lock.
Three remainders pin N down exactly; a wrong guess ends the episode with partial credit
for each remainder it gets right.

Actions: \\boxed{mod 7}   \\boxed{open 52}
"""

import random
import re

PRIMES = [3, 5, 7, 11, 13]


class ModularLockEnv:
    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.primes = sorted(rng.sample(PRIMES, 3))
        self.modulus = self.primes[0] * self.primes[1] * self.primes[2]
        self.secret = rng.randrange(1, self.modulus)
        self.turn = 0
        self.done = False
        self.known = {}
        obs = (
            f"A lock hides a whole number N with 0 < N < {self.modulus}. "
            f"You may ask for N mod p for p in {self.primes}: \\boxed{{mod p}}. "
            f"Open the lock with \\boxed{{open N}}. You have one try and {self.max_turns} turns."
        )
        return obs, {}

    def _partial(self, guess):
        matches = sum(guess % p == self.secret % p for p in self.primes)
        return round(0.3 * matches / 3, 3)

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        command = match.group(1).strip().lower() if match else ""
        parts = command.split()
        obs, reward, terminated = "", 0.0, False
        if len(parts) == 2 and parts[0] == "mod" and parts[1].isdigit():
            p = int(parts[1])
            if p in self.primes:
                self.known[p] = self.secret % p
                obs = f"N mod {p} = {self.known[p]}. Known so far: {self.known}"
            else:
                obs = f"The lock only answers for p in {self.primes}."
        elif len(parts) == 2 and parts[0] == "open" and parts[1].lstrip("-").isdigit():
            guess = int(parts[1])
            terminated = True
            if guess == self.secret:
                obs, reward = f"Click. N = {self.secret}. The lock opens!", 1.0
            else:
                reward = self._partial(guess)
                obs = f"Wrong: N was {self.secret}. The lock stays shut."
        else:
            obs = "Unknown command. Use \\boxed{mod p} or \\boxed{open N}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += f" Out of turns: N was {self.secret}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"known": dict(self.known)}

    def solution(self):
        return [f"\\boxed{{mod {p}}}" for p in self.primes] + [f"\\boxed{{open {self.secret}}}"]
