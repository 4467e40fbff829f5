"""The reference's validation gates as an ablation switch (``designer.gates = 'reference'``):
only ``validate_game``'s load, reset and the actions '1', '2', 'test'. An environment our
strict gates reject (no solution, garbage wins) passes them, so the switch changes which
first attempts score 0 -- the declared effect of our stricter gates on designer rewards."""

import anyio

from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.validate import ValidateConfig, validate_source

NO_SOLUTION = '''
class GuessEnv:
    """Skill: Logical_Deduction. Setting: games."""
    def __init__(self, **kw):
        self.n = 0
    def reset(self, seed=None):
        self.n = 0
        return "Say anything.", {}
    def step(self, action):
        self.n += 1
        return "ok", 1.0, True, False, {}
'''

CRASHES = '''
class BrokenEnv:
    """Skill: Logical_Deduction. Setting: games."""
    def reset(self, seed=None):
        return "Say anything.", {}
    def step(self, action):
        raise ValueError("bad step")
'''


def _verdicts(source):
    async def main():
        async with EnvPool(PoolConfig(max_workers=2)) as pool:
            strict = await validate_source(source, pool=pool)
            ref = await validate_source(source, pool=pool, config=ValidateConfig(gates="reference"))
            return strict, ref

    return anyio.run(main)


def test_reference_gates_accept_what_strict_gates_reject_and_still_catch_crashes():
    strict, ref = _verdicts(NO_SOLUTION)
    assert not strict.valid and strict.stage == "not_done_at_reset"  # garbage wins
    assert ref.valid and ref.stage == "ok"
    strict, ref = _verdicts(CRASHES)
    assert not strict.valid and not ref.valid and ref.stage == "step"
