"""Helpers for the memory tests: distinct synthetic environment sources."""

from __future__ import annotations

import random

from spade_async.memory.records import Origin, make_record

WORDS = ["alpha", "bravo", "delta", "gamma", "sigma", "omega", "kappa", "theta", "lambda",
         "zeta", "rho", "tau", "phi", "chi", "psi", "eta", "iota", "mu", "nu", "xi"]


def env_source(i: int, lines: int = 30) -> str:
    """A games-style environment whose body differs substantially with ``i``."""
    rng = random.Random(i)
    body = []
    for j in range(lines):
        a, b = rng.sample(WORDS, 2)
        body.append(f"        self.{a}_{j} = {rng.randint(0, 10**6)} * {rng.random():.6f}  # {b}")
        if rng.random() < 0.3:
            body.append(f"        if self.{a}_{j} > {rng.randint(0, 999)}: self.{b}_{j} = '{a}{i}'")
    return (
        "import random\nimport re\n\n\n"
        f"class Puzzle{i}Env:\n"
        "    def __init__(self, max_turns: int = 10, **kwargs):\n"
        "        self.max_turns = max_turns\n\n"
        "    def reset(self, seed=None):\n"
        "        self.rng = random.Random(seed)\n" + "\n".join(body) + "\n"
        f"        return 'puzzle {i}', {{}}\n\n"
        "    def step(self, action):\n"
        "        m = re.search(r'\\\\boxed\\{(.+?)\\}', action)\n"
        "        return 'ok', float(bool(m)), bool(m), False, {}\n"
    )


def record(i: int, *, skill: str = "Logical_Deduction", valid: bool = True, version: int = 0,
           source: str | None = None, **kw):
    return make_record(
        source if source is not None else env_source(i),
        origin=Origin(kind="designer", policy_version=version),
        valid=valid, stage="ok" if valid else "step", skill=skill, env_class=f"Puzzle{i}Env", **kw,
    )
