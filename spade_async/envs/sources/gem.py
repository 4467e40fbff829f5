"""``gem:ID`` -- a GEM game (``pip install gem-llm``), e.g. ``gem:game:GuessTheNumber-v0-easy``.

GEM's environments speak text already (``reset(seed) -> (str, info)``, a 5-tuple ``step``, the
agent's reply with ``\\boxed{}``): the source makes one with ``gem.make(ENV_ID)`` in the sandbox
worker (see ``hub``). GEM games have no ``solution()``, so feasibility is "unverified".
Options: ``max_turns`` (default 50).
"""

from __future__ import annotations

from spade_async.envs.sources import Item, Source, check_options, int_option, require
from spade_async.envs.sources.hub import probe, wrapper

_MAKE = """def _make():
    return gem.make(ENV_ID)
"""


def items(src: Source) -> tuple[list[Item], list[str]]:
    check_options(src, {"max_turns"})
    max_turns = int_option(src, "max_turns", 50, 1, 1000)
    require(src.value, "gem", install="gem-llm")
    probe(
        src.value, "gem", src.target, "check the id (gem.envs.registration.ENV_REGISTRY lists them)"
    )
    skill = f"gem-{src.target}"[:200]
    code = wrapper(
        what="GEM", imports="import gem", make=_MAKE, env_id=src.target, origin=src.value,
        skill=skill, max_turns=max_turns,
    )  # fmt: skip
    return [Item(code=code, origin=src.value, skill=skill)], []
