"""Plant lab: tell real causes from a spurious correlation with controlled experiments.

Skill: Causal_Inference. Setting: games.

Four treatments may affect plant growth: water, light, fertiliser and music. A hidden one
or two of them really cause growth; the others do nothing. A farmers' logbook shows a
misleading correlation (confounded: the farmers who play music also water more). The
agent grows plants under treatments of its choice, each measurement carrying a little
noise, and concludes which treatments are causes. An exact answer scores 1.0; otherwise
half the overlap (Jaccard) between its answer and the true causes.

Actions: \\boxed{grow 1 0 1 0}   (water light fertiliser music, 1 = applied)
         \\boxed{conclude water fertiliser}   (or \\boxed{conclude none})
"""

import random
import re

FACTORS = ["water", "light", "fertiliser", "music"]


class PlantLabEnv:
    def __init__(self, max_turns=9, max_experiments=6, **kwargs):
        self.max_turns = max_turns
        self.max_experiments = max_experiments
        self.reset()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        causes = self.rng.sample(FACTORS[:3], self.rng.randint(1, 2))
        self.effects = {f: (self.rng.randint(4, 9) if f in causes else 0) for f in FACTORS}
        self.base = self.rng.randint(5, 10)
        self.experiments = 0
        self.turn = 0
        self.done = False
        spurious = "music" if self.effects["water"] else "water"
        obs = ("Which treatments make plants grow? Candidates: water, light, fertiliser, music.\n"
               f"Farmers' logbook: plants that got {spurious} grew taller on average.\n"
               "Run an experiment with \\boxed{grow w l f m} (0/1 each; growth in cm, a little "
               f"noise; {self.max_experiments} experiments), then \\boxed{{conclude a b}}.")
        return obs, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", (action or "").lower())
        parts = match.group(1).replace(",", " ").split() if match else []
        reward, terminated = 0.0, False
        if len(parts) == 5 and parts[0] == "grow" and all(p in ("0", "1") for p in parts[1:]):
            if self.experiments >= self.max_experiments:
                obs = "The greenhouse is full: conclude now."
            else:
                self.experiments += 1
                applied = [f for f, p in zip(FACTORS, parts[1:]) if p == "1"]
                growth = self.base + sum(self.effects[f] for f in applied) + self.rng.uniform(-1, 1)
                obs = f"Experiment {self.experiments} ({', '.join(applied) or 'nothing'}): {growth:.1f} cm."
        elif parts and parts[0] == "conclude" and set(parts[1:]) <= set(FACTORS) | {"none"}:
            terminated = True
            claimed = set(parts[1:]) - {"none"}
            truth = {f for f, e in self.effects.items() if e}
            if claimed == truth:
                obs, reward = "Correct: " + ", ".join(sorted(truth)) + ".", 1.0
            else:
                reward = round(0.5 * len(claimed & truth) / len(claimed | truth), 3)
                obs = "Not quite: the causes were " + ", ".join(sorted(truth)) + "."
        else:
            obs = "Unknown command. Use \\boxed{grow w l f m} or \\boxed{conclude a b}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Out of time."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"experiments": self.experiments}

    def solution(self):
        trials = ["0 0 0 0", "1 0 0 0", "0 1 0 0", "0 0 1 0", "0 0 0 1"]
        causes = " ".join(f for f, e in self.effects.items() if e)
        return [f"\\boxed{{grow {t}}}" for t in trials] + [f"\\boxed{{conclude {causes}}}"]
