"""Environment families: settings where the designer writes only a family's parameters.

A family turns the designer's short reply into a complete environment file (its extractor)
and writes the designer's prompt. It replaces only those two steps: the file still passes
every validation gate in the sandbox pool, enters memory, is hinted and played, and the
designer is scored and trained on it as on any generated environment. Selected with
``designer.family`` (``configs/cpu-learning.toml``); '' (the default) is free-form code.
"""

from __future__ import annotations

from spade_async.errors import ConfigError
from spade_async.settings.base import Family

__all__ = ["Family", "family"]


def family(name: str) -> Family:
    """The family called ``name``; an unknown name is one clear line."""
    from spade_async.settings import letter_window

    known = {letter_window.FAMILY.name: letter_window.FAMILY}
    if name not in known:
        raise ConfigError(
            f"designer.family = {name!r} is not a known environment family "
            f"(known: {', '.join(sorted(known))}; '' for free-form code)"
        )
    return known[name]
