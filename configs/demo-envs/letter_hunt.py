"""Letter hunt: write one word that uses three given letters.

Skill: Pattern_Recognition. Setting: games.

A demo game for the embedded 135M model (configs/cpu-demo.toml): three common letters are
drawn; the reply's boxed word scores the share of them it contains (1.0 for all three); an
unboxed reply is judged by its first word, at half that. One move ends the game, so every
play has a graded outcome.

Action: \\boxed{word}
"""

import random
import re

COMMON = "etaoinsr"


class LetterHuntEnv:
    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.letters = rng.sample(COMMON, 3)
        self.done = False
        shown = ", ".join(self.letters)
        obs = (f"Write one English word that contains the letters {shown}. "
               "Give it as \\boxed{word}.")
        return obs, {}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        text = action or ""
        match = re.search(r"\\boxed\{([^{}]*)\}", text)
        words = text.split()
        word = (match.group(1) if match else (words[0] if words else "")).lower()
        found = [c for c in self.letters if c in word]
        share = len(found) / len(self.letters)
        reward = round(share if match else 0.5 * share, 3)
        self.done = True
        obs = f"Your word has {len(found)} of the letters {', '.join(self.letters)}."
        return obs, reward, True, False, {"found": len(found)}

    def solution(self):
        return ["\\boxed{" + "".join(self.letters) + "}"]
