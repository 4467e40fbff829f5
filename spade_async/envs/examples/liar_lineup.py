"""Liar lineup: find the culprit among five suspects when only the culprit lies.

Skill: Logical_Deduction. Setting: games.

Five suspects stand in a line. Exactly one is guilty; the guilty one always lies and the
innocent ones always tell the truth. Interviewing a suspect reveals one statement about
another suspect. The statements are generated so that, taken together, exactly one
suspect can be the culprit. Accusing ends the episode: 1.0 if right, 0.0 if wrong.

Actions: \\boxed{ask C}   \\boxed{accuse B}
"""

import random
import re

NAMES = "ABCDE"


def holds(kind, speaker, target, culprit):
    """Truth of a statement if `culprit` were guilty."""
    if kind == "innocent":
        return target != culprit
    if kind == "guilty":
        return target == culprit
    # "neighbour": the culprit stands right next to the speaker
    return abs(NAMES.index(speaker) - NAMES.index(culprit)) == 1


def describe(kind, target):
    if kind == "neighbour":
        return "The culprit stands right next to me."
    return f"{target} is {kind}."


class LiarLineupEnv:
    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.culprit = rng.choice(NAMES)
            self.statements = {}
            for s in NAMES:
                options = [("neighbour", None)]
                options += [(k, t) for k in ("innocent", "guilty") for t in NAMES if t != s]
                honest = s != self.culprit
                options = [(k, t) for k, t in options if holds(k, s, t, self.culprit) == honest]
                self.statements[s] = rng.choice(options)
            consistent = [
                c for c in NAMES
                if all(holds(k, s, t, c) == (s != c) for s, (k, t) in self.statements.items())
            ]
            if consistent == [self.culprit]:
                break
        self.heard = {}
        self.turn = 0
        self.done = False
        obs = (
            f"Suspects {', '.join(NAMES)} stand in a line in that order. Exactly one is the "
            "culprit; the culprit always lies, everyone else tells the truth. Interview a "
            "suspect with \\boxed{ask X}; when sure, \\boxed{accuse X}. One accusation only."
        )
        return obs, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{(.+?)\}", action or "")
        parts = match.group(1).upper().split() if match else []
        reward, terminated = 0.0, False
        if len(parts) == 2 and parts[0] == "ASK" and parts[1] in NAMES:
            kind, target = self.statements[parts[1]]
            self.heard[parts[1]] = describe(kind, target)
            obs = "\n".join(f'{s} says: "{text}"' for s, text in sorted(self.heard.items()))
        elif len(parts) == 2 and parts[0] == "ACCUSE" and parts[1] in NAMES:
            terminated = True
            if parts[1] == self.culprit:
                obs, reward = f"{parts[1]} confesses. Case closed!", 1.0
            else:
                obs = f"{parts[1]} is innocent; the culprit was {self.culprit}."
        else:
            obs = "Unknown command. Use \\boxed{ask X} or \\boxed{accuse X} with X in A-E."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += f"\nOut of time: the culprit was {self.culprit}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"interviewed": len(self.heard)}

    def solution(self):
        return [f"\\boxed{{ask {s}}}" for s in NAMES] + [f"\\boxed{{accuse {self.culprit}}}"]
