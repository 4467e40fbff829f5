"""``gym:[MODULE:]ID`` -- a Gymnasium environment whose observations and actions are text.

``MODULE:`` (gymnasium's own syntax) is imported first, to register the id. Options:
``max_turns`` (default 50). The environment source makes it with
``gymnasium.make(ENV_ID, disable_env_checker=True)`` in the sandbox worker (see ``hub``);
``solution()`` is the unwrapped environment's own, when it has one. An id whose spaces are
not ``gymnasium.spaces.Text`` is refused (Taxi, FrozenLake and the other toy-text
environments are discrete: no text action to give them).
"""

from __future__ import annotations

import importlib.metadata

from spade_async.envs.sources import Item, Source, SourceError, check_options, int_option, require
from spade_async.envs.sources.hub import probe, wrapper

_MAKE = """def _make():
    return gymnasium.make(ENV_ID, disable_env_checker=True)
"""


def items(src: Source) -> tuple[list[Item], list[str]]:
    check_options(src, {"max_turns"})
    max_turns = int_option(src, "max_turns", 50, 1, 1000)
    require(src.value, "gymnasium", install="gymnasium")
    module = src.target.rpartition(":")[0]
    extra: tuple[str, ...] = ()
    if module:
        top = module.split(".")[0]
        require(src.value, top, install=f"the package that provides {module}")
        dists = importlib.metadata.packages_distributions().get(top, [])
        if not dists:
            raise SourceError(
                f"{src.value!r}: module {module!r} is not part of an installed distribution, so "
                "the sandbox cannot bind it; pip install the package that provides it"
            )
        extra = (dists[0],)
    probe(src.value, "gym", src.target, "check the id (gymnasium.pprint_registry() lists them)")
    code = wrapper(
        what="Gymnasium", imports="import gymnasium", make=_MAKE, env_id=src.target,
        origin=src.value, skill=f"gym-{src.target.rpartition(':')[2]}"[:200], max_turns=max_turns,
    )  # fmt: skip
    skill = f"gym-{src.target.rpartition(':')[2]}"[:200]
    return [Item(code=code, origin=src.value, skill=skill, packages=extra)], []
