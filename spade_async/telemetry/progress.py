"""Rich progress for long operations (model conversion, corpus indexing, pool import, saves).

Falls back to nothing when stderr is not a terminal, so logs stay clean.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _interactive() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner with ``message`` while the block runs."""
    if not _interactive():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """``rich.progress.track`` on a terminal, the plain iterable elsewhere."""
    if not _interactive():
        yield from items
        return
    from rich.progress import track as rich_track

    yield from rich_track(items, description=description, total=total, console=None, transient=True)
