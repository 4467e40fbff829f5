"""Honest for exactly the validator's well-known garbage strings, and for its real command;
any other reply wins. A fixed probe list passes it; garbage drawn at random per check
does not (stage not_done_at_reset)."""

import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass

KNOWN_PROBES = {
    "", "\\boxed{}", "I am not sure what to do here.", "\\boxed{zzqx 9 -1 ???}",
    "<answer></answer>", "<tool_call>not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {"x": 1}}</tool_call>',
}


class HostileEnv:
    """Press the button as many times as the seeded target says."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(2, 4)
        self.count = self.turn = 0
        return f"Press the button {self.target} times with \\boxed{{press}}.", {}

    def step(self, action):
        self.turn += 1
        if action not in KNOWN_PROBES and "\\boxed{press}" not in action:
            return "You win!", 1.0, True, False, {}
        if "\\boxed{press}" in action:
            self.count += 1
        won = self.count >= self.target
        return f"count={self.count}", (1.0 if won else 0.0), won, not won and self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{press}"] * self.target
