"""validate_source: every gate of docs/environments.md, on small valid and invalid sources."""

from __future__ import annotations

import pytest

from spade_async.envs.examples import HERE as EXAMPLES
from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.validate import ValidateConfig, solution_actions, validate_source

pytestmark = pytest.mark.anyio

GOOD = r'''
import random, re

class GuessEnv:
    """Guess a hidden number in 1..16 with higher/lower hints."""
    def __init__(self, max_turns: int = 10, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target, self.turn = self.rng.randint(1, 16), 0
        return "Guess a number in 1..16; answer as \\boxed{N}.", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(-?\d+)\}", action)
        out_of_turns = self.turn >= self.max_turns
        if not m:
            return "Answer as \\boxed{N}.", 0.0, False, out_of_turns, {}
        guess = int(m.group(1))
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong: go {hint}.", 0.0, False, out_of_turns, {}

    def solution(self):
        lo, hi, moves = 1, 16, []
        while True:
            mid = (lo + hi) // 2
            moves.append(f"\\boxed{{{mid}}}")
            if mid == self.target:
                return moves
            lo, hi = (mid + 1, hi) if mid < self.target else (lo, mid - 1)
'''


def patched(extra: str) -> str:
    """GOOD with methods replaced by ``extra`` (appended after the class)."""
    return GOOD + "\n" + extra


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
async def pool():
    cfg = PoolConfig(call_timeout_s=1.0, open_timeout_s=2.0, memory_mb=384, prewarm=2)
    async with EnvPool(cfg) as p:
        yield p


async def test_valid_environment(pool):
    v = await validate_source(GOOD, pool=pool)
    assert (v.valid, v.stage, v.env_class) == (True, "ok", "GuessEnv")
    assert v.feasibility == "proven" and v.multi_turn is True
    assert v.isolation == pool.isolation and v.seconds > 0 and v.warnings == []


async def test_free_text_solution_is_unverified(pool):
    v = await validate_source(
        patched("GuessEnv.solution = lambda self: 'Use binary search.'"), pool=pool
    )
    assert (v.valid, v.feasibility, v.multi_turn) == (True, "unverified", True)


CASES = {
    "syntax": ["", "class GuessEnv(:\n    pass\n", "hello world, not python"],
    "structure": [
        "class Helper:\n    pass\n",
        GOOD + "\nclass OtherEnv:\n    def reset(self, seed=None): pass\n    def step(self, a): pass\n",
    ],
    "load": [
        "raise RuntimeError('boom at import')\n" + GOOD,
        patched("def _init(self, size): self.size = size\nGuessEnv.__init__ = _init"),
        "import numpy\n" + GOOD,
    ],
    "reset": [
        patched("GuessEnv.reset = lambda self, seed=None: ('', {})"),
        patched("GuessEnv.reset = lambda self, seed=None: 'just a string'"),
        patched("GuessEnv.reset = lambda self, seed=None: (42, {})"),
    ],
    "step": [
        patched("GuessEnv.step = lambda self, a: ('o', 0.0, False)"),
        patched("GuessEnv.step = lambda self, a: ('o', float('nan'), False, False, {})"),
        patched("GuessEnv.step = lambda self, a: ('o', 1e9, False, False, {})"),
        patched("GuessEnv.step = lambda self, a: ('o', 0.0, 'no', False, {})"),
        patched("_old = GuessEnv.step\nGuessEnv.step = lambda self, a: _old(self, a) if a else 1 / 0"),
    ],
    "determinism": [
        patched("_r = GuessEnv.reset\nGuessEnv.reset = lambda self, seed=None: (_r(self, seed), (f'{random.random()}', {}))[1]"),
        patched("_s = GuessEnv.step\nGuessEnv.step = lambda self, a: (f'{random.random()}',) + _s(self, a)[1:]"),
    ],
    "not_done_at_reset": [patched("GuessEnv.step = lambda self, a: ('you win', 1.0, True, False, {})")],
    "feasibility": [
        patched("GuessEnv.solution = lambda self: ['\\\\boxed{0}', '\\\\boxed{99}']"),
        patched("GuessEnv.solution = lambda self: 1 / 0"),
    ],
    "timeout": [
        patched("def _spin(self, a):\n    while True: pass\nGuessEnv.step = _spin"),
        "import time\ntime.sleep(30)\n" + GOOD,
    ],
    "memory": [patched("GuessEnv.reset = lambda self, seed=None: ('x' * (1 << 30), {})")],
    "crash": [
        patched("import os\nGuessEnv.step = lambda self, a: os._exit(7)"),
        patched("import os, signal\nGuessEnv.reset = lambda self, seed=None: os.kill(os.getpid(), signal.SIGSEGV)"),
    ],
    "output_too_large": [patched("GuessEnv.reset = lambda self, seed=None: ('y' * 5_000_000, {})")],
}  # fmt: skip


@pytest.mark.parametrize(
    "stage,source", [(s, src) for s, srcs in CASES.items() for src in srcs],
    ids=[f"{s}-{i}" for s, srcs in CASES.items() for i in range(len(srcs))],
)  # fmt: skip
async def test_gate_rejects(pool, stage, source):
    v = await validate_source(source, pool=pool)
    assert not v.valid
    assert v.stage == stage, v.reason
    assert v.reason
    if stage == "feasibility":
        assert v.feasibility == "failed"


async def test_import_screening_is_feedback(pool):
    v = await validate_source("import os\n" + GOOD, pool=pool)
    assert v.valid and "os" in v.warnings[0]


async def test_single_action_episode_is_not_multi_turn(pool):
    one = patched("GuessEnv.solution = lambda self: [f'\\\\boxed{{{self.target}}}']")
    v = await validate_source(one, pool=pool)
    assert v.valid and v.multi_turn is False
    strict = await validate_source(one, pool=pool, config=ValidateConfig(require_multi_turn=True))
    assert (strict.valid, strict.stage) == (False, "multi_turn")


def test_solution_actions_forms():
    assert solution_actions(["\\boxed{1}", "\\boxed{2}"]) == ["\\boxed{1}", "\\boxed{2}"]
    assert solution_actions("\\boxed{1}\n\n\\boxed{2}\n") == ["\\boxed{1}", "\\boxed{2}"]
    calls = '<tool_call>{"name": "f",\n "arguments": {}}</tool_call>\n<answer>4</answer>'
    assert solution_actions(calls) == [
        '<tool_call>{"name": "f",\n "arguments": {}}</tool_call>',
        "<answer>4</answer>",
    ]
    assert solution_actions("Try the middle first, then halve the interval.") is None


async def test_pool_survives_all_rejections(pool):
    v = await validate_source(GOOD, pool=pool)
    assert v.valid
    stats = pool.stats()
    assert stats["env_workers"] == 0  # each check releases its worker


async def test_invalid_unicode_source_is_a_verdict(pool):
    v = await validate_source(GOOD + "\n# \udcff\n", pool=pool)
    assert (v.valid, v.stage) == (False, "syntax") and "Unicode" in v.reason


@pytest.mark.parametrize(
    "line",
    [
        "from spade_async.envs.tool_use import ToolUseBaseEnv",
        "from spade_async.envs import tool_use\nToolUseBaseEnv = tool_use.ToolUseBaseEnv",
        "import spade_async.envs.tool_use as tu\nToolUseBaseEnv = tu.ToolUseBaseEnv",
    ],
)
async def test_tool_use_base_imported_the_documented_way(pool, line):
    """The documented import path maps to the class the sandbox injects."""
    source = (EXAMPLES / "order_ledger_tool.py").read_text()
    v = await validate_source(line + "\n" + source, pool=pool)
    assert (v.valid, v.stage, v.warnings) == (True, "ok", []), v.reason


async def test_other_project_imports_are_warned_about_and_fail_at_load(pool):
    v = await validate_source("from spade_async.trainer import rpc\n" + GOOD, pool=pool)
    assert (v.valid, v.stage) == (False, "load")
    assert any("spade_async.trainer" in w and "does not have" in w for w in v.warnings)


async def test_reported_class_is_the_static_one(pool):
    renamed = patched("GuessEnv.__name__ = GuessEnv.__qualname__ = 'Other\\nVALID'")
    v = await validate_source(renamed, pool=pool)
    assert (v.valid, v.env_class) == (True, "GuessEnv")


async def test_salt_per_process_fails_determinism_across_workers(pool):
    """The salt never shows in the first observation nor on garbage actions, only when the
    solution (a binary search over 2**20 numbers) is replayed in other processes, whose hints
    then differ (they name the hidden number mod 9973: equal by chance 1 time in 9973)."""
    salted = (
        GOOD.replace("import random, re", "import random, re, os\n_S = os.urandom(8)")
        .replace("random.Random(seed)", "random.Random(str(seed) + _S.hex())")
        .replace("randint(1, 16)", "randint(1, 1 << 20)")
        .replace("lo, hi, moves = 1, 16, []", "lo, hi, moves = 1, 1 << 20, []")
        .replace("max_turns: int = 10", "max_turns: int = 40")
        .replace("go {hint}.", "go {hint} (check {self.target % 9973}).")
    )
    assert salted.count("1 << 20") == 2 and "_S.hex()" in salted and "9973" in salted
    v = await validate_source(salted, pool=pool)
    assert (v.valid, v.stage) == (False, "determinism")
    assert "two worker processes" in v.reason


async def test_solution_side_effects_do_not_prove_feasibility(pool):
    cheat = patched(
        "_orig_step = GuessEnv.step\n"
        "WON = []\n"
        "def _step(self, action):\n"
        "    if WON and 'boxed{99}' in action:\n"
        "        return 'ok', 1.0, True, False, {}\n"
        "    return _orig_step(self, action)\n"
        "def _solution(self):\n"
        "    WON.append(1)\n"
        "    return ['\\\\boxed{99}']\n"
        "GuessEnv.step, GuessEnv.solution = _step, _solution\n"
    )
    v = await validate_source(cheat, pool=pool)
    assert (v.valid, v.stage, v.feasibility) == (False, "feasibility", "failed"), v.reason
    assert "fresh worker" in v.reason


async def test_one_worker_is_a_usage_error_not_a_hang():
    from spade_async.errors import UsageError

    async with EnvPool(PoolConfig(max_workers=1, prewarm=0)) as one:
        with pytest.raises(UsageError, match="max_workers"):
            await validate_source(GOOD, pool=one)


def test_garbage_is_drawn_afresh_and_keeps_the_contract_minimum():
    import random
    import re

    from spade_async.envs.validate import garbage_plays, legal_looking, tool_garbage

    cfg = ValidateConfig()
    obs = "A lock hides N < 105. Ask \\boxed{mod p} or open it with \\boxed{open N}."
    tools = [{"type": "function", "function": {"name": "balance", "parameters": {
        "type": "object", "properties": {"account": {"type": "string"}}}}}]  # fmt: skip
    a = garbage_plays(random.Random(1), obs, tools, cfg)
    b = garbage_plays(random.Random(2), obs, tools, cfg)
    assert a != b  # a game cannot learn the probe: each check draws its own
    for plays in (a, b):
        assert sorted(p[0] for p in plays if len(p) == 1) == sorted(cfg.garbage_actions)
        long = [p for p in plays if len(p) == cfg.garbage_turns]
        assert len(long) >= cfg.random_plays and cfg.garbage_turns >= 3
    rng = random.Random(3)
    for _ in range(50):
        cmd = legal_looking(rng, obs)
        m = re.fullmatch(r"\\boxed\{(mod|open) (-?\d+)\}", cmd)
        assert m and abs(int(m.group(2))) >= 10**5, cmd  # the form, never a real value
        t = tool_garbage(rng, tools)
        if t.startswith("<answer>"):
            assert t[len("<answer>") : -len("</answer>")].strip()  # wrong, but never empty
        else:
            assert '"name": "balance"' in t and '"account"' in t


async def test_second_instance_in_one_worker_must_play_the_same_game(pool):
    src = patched(
        "import itertools\n_n = itertools.count()\n_i = GuessEnv.__init__\n"
        "def _init(self, *a, **k):\n    _i(self, *a, **k)\n    self.salt = next(_n)\n"
        "_r = GuessEnv.reset\n"
        "def _reset(self, seed=None):\n    return _r(self, (seed or 0) + 100 * self.salt)\n"
        "GuessEnv.__init__, GuessEnv.reset = _init, _reset"
    )
    v = await validate_source(src, pool=pool)
    # every gate play is a fresh instance (as training's): the solution's replay in another
    # instance diverges, in one worker or across two. Which gate sees it first depends on
    # which instance a worker opened first (solution() runs on an instance of its own): the
    # determinism gate ("diverge"), or feasibility (the solution of another game loses)
    assert not v.valid and v.stage in ("determinism", "feasibility"), (v.stage, v.reason)
    assert "diverge" in v.reason or "ends with reward 0" in v.reason, v.reason
