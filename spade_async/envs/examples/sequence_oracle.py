"""Sequence oracle: uncover the rule behind a number sequence and predict a far term.

Skill: Pattern_Recognition. Setting: games.

A hidden rule (arithmetic, geometric, quadratic, Fibonacci-like, or alternating two
operations) generates t1, t2, t3, ... The agent sees three terms and may reveal more, one
per turn, up to t7; then it must predict t10. Three terms rarely pin the rule down, so
revealing is part of the game. A correct prediction scores 1.0; a wrong one ends the
episode with 0.0.

Actions: \\boxed{reveal}   \\boxed{predict 1234}
"""

import random
import re


def make_rule(rng):
    kind = rng.choice(["arithmetic", "geometric", "quadratic", "fibonacci", "alternating"])
    if kind == "arithmetic":
        a, d = rng.randint(-20, 20), rng.choice([-7, -5, -3, 3, 4, 6, 9])
        return kind, lambda n: a + d * (n - 1)
    if kind == "geometric":
        a, r = rng.randint(1, 5), rng.choice([2, 3, -2])
        return kind, lambda n: a * r ** (n - 1)
    if kind == "quadratic":
        a, b, c = rng.randint(1, 3), rng.randint(-5, 5), rng.randint(-9, 9)
        return kind, lambda n: a * n * n + b * n + c
    if kind == "fibonacci":
        x, y = rng.randint(1, 6), rng.randint(1, 6)
        terms = [x, y]
        while len(terms) < 12:
            terms.append(terms[-1] + terms[-2])
        return kind, lambda n: terms[n - 1]
    p, q = rng.randint(2, 9), rng.choice([2, 3])  # alternately add p, then multiply by q
    terms = [rng.randint(1, 5)]
    while len(terms) < 12:
        terms.append(terms[-1] + p if len(terms) % 2 == 1 else terms[-1] * q)
    return kind, lambda n: terms[n - 1]


class SequenceOracleEnv:
    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.kind, rule = make_rule(rng)
        self.terms = [rule(n) for n in range(1, 11)]
        self.shown = 3
        self.turn = 0
        self.done = False
        obs = (f"Sequence: {self._shown()}, ... Reveal the next term with \\boxed{{reveal}} "
               "(up to t7), then predict the 10th term with \\boxed{predict N}. One prediction.")
        return obs, {}

    def _shown(self):
        return ", ".join(f"t{i + 1}={v}" for i, v in enumerate(self.terms[: self.shown]))

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        parts = match.group(1).strip().lower().split() if match else []
        reward, terminated = 0.0, False
        if parts == ["reveal"]:
            if self.shown < 7:
                self.shown += 1
                obs = f"Sequence: {self._shown()}, ..."
            else:
                obs = f"No more reveals. Sequence: {self._shown()}, ... Predict t10."
        elif len(parts) == 2 and parts[0] == "predict" and re.fullmatch(r"-?\d+", parts[1]):
            terminated = True
            if int(parts[1]) == self.terms[9]:
                obs, reward = f"Correct: t10 = {self.terms[9]} ({self.kind} rule).", 1.0
            else:
                obs = f"Wrong: t10 = {self.terms[9]} ({self.kind} rule)."
        else:
            obs = "Unknown command. Use \\boxed{reveal} or \\boxed{predict N}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += f" Out of turns: t10 was {self.terms[9]}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"shown": self.shown}

    def solution(self):
        reveals = ["\\boxed{reveal}"] * max(0, 6 - self.shown)
        return reveals + [f"\\boxed{{predict {self.terms[9]}}}"]
