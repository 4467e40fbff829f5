"""``verifiers:MODULE`` -- reserved: a verifiers environment as an environment of ours.

Not implemented: a verifiers environment's rollout is driven by its own async client and
rubric loop (the model inside it), which would have to be inverted into ``step(action)``.
The value is refused in one line (exit 2, nothing stored) until then; docs/interop.md says
what to use instead.
"""

from __future__ import annotations

from spade_async.envs.sources import Item, Source, SourceError


def items(src: Source) -> tuple[list[Item], list[str]]:
    raise SourceError(
        f"{src.value!r}: importing verifiers environments is not implemented yet; choose rg:, "
        "gym: or gem: (or export yours with spade memory export --format verifiers)"
    )
