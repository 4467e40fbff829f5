"""How an exported environment runs (copied into verifiers and OpenEnv exports as ``_runtime.py``).

WARNING: the environments are model-written code. ``open_env`` runs one in spade-async's
sandbox when spade-async is installed. Without it, it refuses, unless the caller opts in,
loudly, by setting ``SPADE_ALLOW_UNSANDBOXED=1``: then the code runs in this process with a
``RuntimeWarning`` and a line on stderr. Standard library only (and spade-async when present).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

OPT_IN = "SPADE_ALLOW_UNSANDBOXED"


def sandbox_available() -> bool:
    try:
        importlib.import_module("spade_async.envs.gym")
    except ImportError:
        return False
    return True


class _InProcess:
    """The environment class run in this process (the opt-in path)."""

    def __init__(self, cls, kwargs):
        self._env = cls(**kwargs)

    def reset(self, seed=None):
        obs, info = self._env.reset(seed=seed)
        return str(obs), dict(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(str(action))
        return str(obs), float(reward), bool(terminated), bool(truncated), dict(info)

    def solution(self):
        return self._env.solution()

    def close(self):
        close = getattr(self._env, "close", None)
        if callable(close):
            close()


class _Sandboxed:
    def __init__(self, source, packages, kwargs):
        from spade_async.envs.gym import SandboxedEnv
        from spade_async.envs.pool import PoolConfig

        budget = {"open_timeout_s": 60.0, "call_timeout_s": 10.0} if packages else {}
        config = PoolConfig(prewarm=0, max_workers=1, packages=tuple(packages), **budget)
        self._env = SandboxedEnv(source, kwargs=kwargs or None, pool_config=config)
        self.isolation = self._env.isolation

    def reset(self, seed=None):
        return self._env.reset(seed=seed)

    def step(self, action):
        return self._env.step(str(action))

    def solution(self):
        return self._env.solution()

    def close(self):
        self._env.close()


def open_env(module: str, **kwargs):
    """An object with ``reset(seed)``, ``step(action)``, ``solution()``, ``close()`` running the
    environment of ``module`` (an exported ``envs/env_<id>.py``)."""
    mod = importlib.import_module(module)
    packages = list(mod.METADATA.get("packages") or [])
    if sandbox_available():
        return _Sandboxed(mod.SOURCE, packages, kwargs)
    if os.environ.get(OPT_IN) != "1":
        raise RuntimeError(
            f"{module} is model-written code and spade-async (its sandbox) is not installed: "
            f"pip install spade-async, or set {OPT_IN}=1 to run it unsandboxed in this process"
        )
    msg = f"{module}: running model-written environment code UNSANDBOXED ({OPT_IN}=1)"
    print(f"WARNING: {msg}", file=sys.stderr)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return _InProcess(mod.load(), kwargs)
