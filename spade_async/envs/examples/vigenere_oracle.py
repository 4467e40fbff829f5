"""Vigenere oracle: break a repeating-key cipher using an encryption oracle.

Skill: Pattern_Recognition. Setting: games.

A secret word (the plaintext) was encrypted with a Vigenere cipher: each letter is shifted
by the matching letter of a short repeating key (a=0, b=1, ...). The agent sees the
ciphertext and may encrypt texts of its own choice with the same key; the shifts it sees
reveal the key's repeating pattern. Each wrong decryption reports how many letters are
right; three wrong tries end the episode with half the best fraction of letters right.

Actions: \\boxed{encode aaaaaaa}   \\boxed{decode gardenpath}
"""

import random
import re

WORDS = ["lantern", "harbour", "meadow", "crystal", "orchard", "thunder", "compass",
         "glacier", "saffron", "velvet", "pioneer", "quarry", "marble", "willow"]


def vigenere(text, key):
    return "".join(chr((ord(ch) - 97 + ord(key[i % len(key)]) - 97) % 26 + 97)
                   for i, ch in enumerate(text))


class VigenereOracleEnv:
    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.plaintext = rng.choice(WORDS) + rng.choice(WORDS)
        self.key = "".join(rng.choice("bcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 4)))
        self.ciphertext = vigenere(self.plaintext, self.key)
        self.turn = 0
        self.tries = 0
        self.best = 0.0
        self.done = False
        obs = (f"Ciphertext: {self.ciphertext}\nIt is a repeating-key Vigenere cipher over a-z. "
               "Encrypt your own text with \\boxed{encode text} (letters only, up to 20), and "
               "submit the plaintext with \\boxed{decode text} (three tries).")
        return obs, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        parts = match.group(1).strip().lower().split() if match else []
        reward, terminated = 0.0, False
        if len(parts) == 2 and parts[0] in ("encode", "decode") and parts[1].isalpha() and parts[1].isascii():
            text = parts[1]
            if parts[0] == "encode":
                obs = f"encode({text[:20]}) = {vigenere(text[:20], self.key)}"
            elif text == self.plaintext:
                obs, reward, terminated = "Decrypted. Well done!", 1.0, True
            else:
                self.tries += 1
                right = sum(a == b for a, b in zip(text, self.plaintext))
                self.best = max(self.best, right / len(self.plaintext))
                obs = f"Not it: {right} of {len(self.plaintext)} letters are right."
                if self.tries >= 3:
                    reward, terminated = round(0.5 * self.best, 3), True
                    obs += f" No tries left; the plaintext was {self.plaintext}."
        else:
            obs = "Unknown command. Use \\boxed{encode text} or \\boxed{decode text}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            reward = round(0.5 * self.best, 3)
            obs += f" Out of turns; the plaintext was {self.plaintext}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"tries": self.tries}

    def solution(self):
        return ["\\boxed{encode aaaaaaaa}", f"\\boxed{{decode {self.plaintext}}}"]
