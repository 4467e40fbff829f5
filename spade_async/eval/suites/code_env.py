"""Environment source that runs candidate programs inside the sandbox pool (stdlib only).

One ``step()`` = one test: the action is JSON ``{"program", "kind", ...}``; ``kind`` is
``check`` (exec the program, which raises on failure: HumanEval), ``stdin`` (feed
``input``, compare stdout with ``output``) or ``functional`` (``Solution().func(*args)``,
one JSON value per input line). The pool's per-call timeout is the per-test timeout; an
infinite loop, a crash or ``os._exit`` kills the worker and the test fails.
"""

SOURCE = r"""
import io
import json
import sys


class CodeCheckEnv:
    def __init__(self, max_turns: int = 1, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "send one test as JSON", {}

    def _run(self, spec):
        kind = spec["kind"]
        ns = {"__name__": "__main__" if kind == "stdin" else "__candidate__"}
        code = compile(spec["program"], "<candidate>", "exec")
        if kind == "check":
            exec(code, ns)
            return True, ""
        if kind == "stdin":
            old_in, old_out = sys.stdin, sys.stdout
            sys.stdin, sys.stdout = io.StringIO(spec["input"]), io.StringIO()
            try:
                exec(code, ns)
                got = sys.stdout.getvalue()
            finally:
                sys.stdin, sys.stdout = old_in, old_out
            want = spec["output"]
            norm = lambda s: [ln.strip() for ln in s.strip().splitlines()]
            return norm(got) == norm(want), got[-300:]
        exec(code, ns)
        args = [json.loads(ln) for ln in spec["input"].splitlines() if ln.strip()]
        got = getattr(ns["Solution"](), spec["func_name"])(*args)
        want = json.loads(spec["output"])
        return got == want, repr(got)[-300:]

    def step(self, action):
        try:
            ok, detail = self._run(json.loads(action))
        except BaseException as e:  # SystemExit and KeyboardInterrupt are failures too
            return f"failed: {type(e).__name__}: {str(e)[:300]}", 0.0, True, False, {}
        return ("passed" if ok else "wrong: " + detail), 1.0 if ok else 0.0, True, False, {}

    def solution(self):
        return ""
"""
