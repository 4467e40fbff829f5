"""Installed packages that a pool's workers may import (``PoolConfig.packages``).

Generated environments are standard library only (docs/environments.md), so a pool's workers see
no site-packages by default. Trusted environment code of our own (the reasoning-gym
evaluation suites) needs a library: the pool names its distributions, and each one's
top-level modules, with those of every installed requirement, are bound read-only into
bubblewrap workers at ``/opt/spade/site-packages`` (on ``sys.path`` there), each with its metadata
directory (``NAME.dist-info``: libraries that read their own version with
``importlib.metadata`` at import, as httpx2 and verifiers' do, find it). Nothing else of the
virtual environment, the project or the home directory becomes visible. At the ``unshare``
and ``rlimit`` levels the worker is the virtual environment's interpreter, which sees its
site-packages anyway.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re

from packaging.requirements import Requirement

from spade_async.errors import SpadeError

__all__ = ["SITE", "package_binds"]

# "site-packages" in the path: libraries tell installed modules by it (dill, which datasets
# fingerprints with, pickles a module found elsewhere by value, and fails)
SITE = "/opt/spade/site-packages"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=8)
def package_binds(distributions: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(name under SITE, host path)`` of every top-level module or package directory of
    ``distributions`` and of their installed requirements (extras not followed). A named
    distribution that is not installed is a one-line error; a requirement that is not
    installed is left out (its importer fails inside the worker as it would outside)."""
    seen: set[str] = set()
    binds: dict[str, str] = {}

    def walk(name: str, *, required: bool) -> None:
        if _key(name) in seen:
            return
        seen.add(_key(name))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if required:
                raise SpadeError(
                    f"envs.packages names {name!r}, which is not installed here: pip install "
                    f"{name} (or drop it from envs.packages)"
                ) from None
            return
        if required and not dist.files:
            raise SpadeError(
                f"envs.packages names {name!r}, whose installation lists no files (no RECORD): "
                f"reinstall it with pip"
            )
        for f in dist.files or []:
            top = f.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            if len(f.parts) == 1 and not top.endswith((".py", ".so")):
                continue  # scripts, licences and data files at the top of site-packages
            binds.setdefault(top, str(dist.locate_file(top).resolve()))
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                walk(req.name, required=False)

    for name in distributions:
        walk(name, required=True)
    return tuple(sorted(binds.items(), key=lambda kv: kv[0]))
