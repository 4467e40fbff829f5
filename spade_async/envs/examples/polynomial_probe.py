"""Polynomial probe: identify a hidden cubic by evaluating it at points of your choice.

Skill: Mathematical_Reasoning. Setting: games.

The environment hides p(x) = a*x^3 + b*x^2 + c*x + d with small integer coefficients.
Each evaluation costs a turn and there are only five of them; four well-chosen points
determine the cubic (interpolation or finite differences). Submitting the coefficients
ends the episode; partial credit counts the coefficients that are right.

Actions: \\boxed{eval 2}   \\boxed{answer 1 -3 0 7}   (a b c d)
"""

import random
import re


class PolynomialProbeEnv:
    def __init__(self, max_turns=10, max_evals=5, **kwargs):
        self.max_turns = max_turns
        self.max_evals = max_evals
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.coeffs = [rng.choice([-3, -2, -1, 1, 2, 3])] + [rng.randint(-9, 9) for _ in range(3)]
        self.turn = 0
        self.evals = {}
        self.done = False
        obs = (
            "A hidden polynomial p(x) = a*x^3 + b*x^2 + c*x + d has integer coefficients "
            "(a is nonzero, all between -9 and 9). Evaluate it with \\boxed{eval x} for an "
            f"integer -10 <= x <= 10 (at most {self.max_evals} evaluations), then submit "
            "\\boxed{answer a b c d}."
        )
        return obs, {}

    def p(self, x):
        a, b, c, d = self.coeffs
        return a * x**3 + b * x**2 + c * x + d

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        parts = match.group(1).split() if match else []
        obs, reward, terminated = "", 0.0, False
        try:
            numbers = [int(v) for v in parts[1:]]
        except ValueError:
            numbers = None
        if parts and parts[0].lower() == "eval" and numbers is not None and len(numbers) == 1:
            x = numbers[0]
            if not -10 <= x <= 10:
                obs = "x must be between -10 and 10."
            elif len(self.evals) >= self.max_evals and x not in self.evals:
                obs = "No evaluations left: submit \\boxed{answer a b c d}."
            else:
                self.evals[x] = self.p(x)
                left = self.max_evals - len(self.evals)
                obs = f"p({x}) = {self.evals[x]}. Evaluations left: {left}."
        elif parts and parts[0].lower() == "answer" and numbers is not None and len(numbers) == 4:
            terminated = True
            right = sum(g == c for g, c in zip(numbers, self.coeffs))
            if right == 4:
                obs, reward = "Correct, that is the polynomial.", 1.0
            else:
                obs, reward = f"Not quite: the coefficients were {self.coeffs}.", 0.1 * right
        else:
            obs = "Unknown command. Use \\boxed{eval x} or \\boxed{answer a b c d}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += f" Out of turns: the coefficients were {self.coeffs}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"evaluations": dict(self.evals)}

    def solution(self):
        a, b, c, d = self.coeffs
        return [f"\\boxed{{eval {x}}}" for x in (-1, 0, 1, 2)] + [f"\\boxed{{answer {a} {b} {c} {d}}}"]
