"""Mastermind: deduce a hidden four-digit code from exact/near feedback.

Skill: Logical_Deduction. Setting: games.

The code has four digits, each 1-6 (repeats allowed). After each guess the agent learns
how many digits are right and in the right place ("exact") and how many further digits
are right but misplaced ("near"). Cracking the code scores 1.0; running out of guesses
scores half the best exact count seen, over four.

Action: \\boxed{guess 1234}
"""

import random
import re
from collections import Counter


def score(code, guess):
    exact = sum(c == g for c, g in zip(code, guess))
    common = sum((Counter(code) & Counter(guess)).values())
    return exact, common - exact


class MastermindEnv:
    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code = "".join(rng.choice("123456") for _ in range(4))
        self.turn = 0
        self.best_exact = 0
        self.history = []
        self.done = False
        obs = (
            "I am thinking of a 4-digit code; each digit is 1-6 and digits may repeat. "
            "Guess with \\boxed{guess 1234}. I answer with 'exact' (right digit, right place) "
            f"and 'near' (right digit, wrong place). You have {self.max_turns} guesses."
        )
        return obs, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        guess = re.sub(r"[^0-9]", "", match.group(1)) if match else ""
        reward, terminated = 0.0, False
        if len(guess) != 4 or any(ch not in "123456" for ch in guess):
            obs = "Invalid guess: give exactly four digits from 1 to 6, e.g. \\boxed{guess 1123}."
        else:
            exact, near = score(self.code, guess)
            self.best_exact = max(self.best_exact, exact)
            self.history.append((guess, exact, near))
            if exact == 4:
                obs, reward, terminated = f"{guess}: cracked it!", 1.0, True
            else:
                lines = [f"{g}: exact={e} near={n}" for g, e, n in self.history]
                obs = "History:\n" + "\n".join(lines)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            reward = 0.5 * self.best_exact / 4
            obs += f"\nOut of guesses. The code was {self.code}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"guesses": len(self.history)}

    def solution(self):
        probes = [p for p in ("1122", "3344") if p != self.code]
        return [f"\\boxed{{guess {p}}}" for p in probes] + [f"\\boxed{{guess {self.code}}}"]
