"""A dense-reward environment: the share of lower-case letters in two replies.

Random replies score anywhere in [0, 1], so every group of plays has reward variance and
GRPO always has something to learn from (the loop tests need a trainer step every step).
"""


class LowerShareEnv:
    def __init__(self, max_turns: int = 2, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn, self.score = 0, 0.0
        return "Answer twice in lower-case letters only.", {}

    def step(self, action):
        self.turn += 1
        text = (action or "").strip()
        share = sum(c.islower() for c in text) / len(text) if text else 0.0
        self.score += share / self.max_turns
        if self.turn >= self.max_turns:
            return "done", 1.0 if self.score >= 1 else round(self.score, 4), True, False, {}
        return "again", 0.0, False, False, {}

    def solution(self):
        return ["abc", "def"]
