"""Number hunt: find a hidden number from 2 to 9 in three guesses.

Skill: Mathematical_Reasoning. Setting: games.

A demo game for the embedded 135M model (configs/cpu-demo.toml). Each guess is answered
"higher" or "lower"; the right number scores 1.0. After the third guess the game ends and
scores half of how close the best guess came (0.5 x (1 - distance / 7)), so most plays
earn a graded reward. A boxed reply must hold a bare number; an unboxed one counts its
last number.

Action: \\boxed{5}
"""

import random
import re


class NumberHuntEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(2, 9)
        self.turn = 0
        self.best = None
        self.done = False
        obs = ("I am thinking of a whole number from 2 to 9. You have three guesses; I say "
               "higher or lower after each. Answer as \\boxed{n}.")
        return obs, {}

    def _guess(self, text):
        if "\\boxed" in text:
            match = re.search(r"\\boxed\{\s*(\d{1,2})\s*\}", text)
            return int(match.group(1)) if match else None
        numbers = re.findall(r"\d{1,2}", text)
        return int(numbers[-1]) if numbers else None

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.turn += 1
        guess = self._guess(action or "")
        if guess is not None and (self.best is None
                                  or abs(guess - self.secret) < abs(self.best - self.secret)):
            self.best = guess
        if guess == self.secret:
            self.done = True
            return f"Yes, it is {self.secret}.", 1.0, True, False, {}
        if guess is None:
            obs = "That is not a number: answer as \\boxed{n}."
        else:
            obs = f"{guess} is wrong: the number is {'higher' if guess < self.secret else 'lower'}."
        if self.turn >= self.max_turns:
            self.done = True
            gap = 7 if self.best is None else min(7, abs(self.best - self.secret))
            reward = round(0.5 * (1 - gap / 7), 3)
            return obs + f" Out of guesses; it was {self.secret}.", reward, True, False, {}
        return obs, 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.secret}}}"]
