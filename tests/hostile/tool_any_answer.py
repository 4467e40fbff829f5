"""A tool-use environment whose answer check accepts any non-empty answer: the validator's
fixed probes only ever send an empty answer, so it passes them; a wrong non-empty answer
wins (stage not_done_at_reset)."""

import random

try:  # tag this process so the test can prove that nothing outlives the suite
    with open("/proc/self/comm", "w") as _f:
        _f.write("spdhostile")
except OSError:
    pass


class LedgerLookupEnv(ToolUseBaseEnv):  # noqa: F821 - injected by the sandbox, as in the reference
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count, self.answer_attempts, self.done = 0, 0, False
        self._state = {f"acct{i}": rng.randint(10, 999) for i in range(5)}
        self._who = f"acct{rng.randrange(5)}"
        self._expected_answer = str(self._state[self._who])
        self._tools = {
            "balance": {
                "description": "Balance of an account.",
                "parameters": {"type": "object", "properties": {"account": {"type": "string"}},
                               "required": ["account"]},
            }
        }
        return f"What is the balance of {self._who}? Use the balance tool, then answer.", {}

    def tool_balance(self, account=""):
        return str(self._state.get(account, "no such account"))

    def _check_answer(self, answer):
        return bool(str(answer).strip())

    def solution(self):
        return [self.tool_call_action("balance", account=self._who), self.answer_action(self._expected_answer)]
