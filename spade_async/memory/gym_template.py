"""The gymnasium adapter of an exported environment package (copied into it as ``_gym.py``).

WARNING: the environments are model-written code. ``SpadeTextEnv`` runs one in the
spade-async sandbox when spade-async is installed (``sandbox="auto"`` or ``True``);
otherwise (``sandbox=False``, or ``"auto"`` without spade-async) it runs the code in this
process, unsandboxed, and says so with a ``RuntimeWarning``. Run untrusted code sandboxed.

This file imports only the standard library and gymnasium (and spade-async when it sandboxes),
so the exported package works in any project.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import gymnasium
from gymnasium import spaces

MAX_TEXT = 1_000_000


class AnyText(spaces.Text):
    """Any ``str`` up to ``max_length`` characters (environments write free text: unicode
    included); ``sample()`` draws from the printable charset."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


from spade_async.envs.solution import solution_actions  # noqa: E402  (inlined by the export)


def _sandbox_available() -> bool:
    try:
        importlib.import_module("spade_async.envs.gym")
    except ImportError:
        return False
    return True


class SpadeTextEnv(gymnasium.Env):
    """One exported environment: text observations, text actions (the agent's reply)."""

    metadata = {"render_modes": []}

    def __init__(self, module: str, sandbox: bool | str = "auto", **env_kwargs: Any) -> None:
        mod = importlib.import_module(module)
        self.spade_metadata = dict(mod.METADATA)
        self.observation_space = AnyText(max_length=MAX_TEXT, min_length=0)
        self.action_space = AnyText(max_length=MAX_TEXT, min_length=0)
        if sandbox == "auto":
            sandbox = _sandbox_available()
        self.sandboxed = bool(sandbox)
        if self.sandboxed:
            from spade_async.envs.gym import SandboxedEnv

            self._env = SandboxedEnv(mod.SOURCE, kwargs=env_kwargs or None)
        else:
            warnings.warn(
                f"{module}: running model-written environment code in this process, "
                "unsandboxed (install spade-async, or pass sandbox=True, to sandbox it)",
                RuntimeWarning,
                stacklevel=2,
            )
            self._env = mod.load()(**env_kwargs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        if self.sandboxed:
            return self._env.reset(seed=seed)
        obs, info = self._env.reset(seed=seed)
        return obs, dict(info)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self._env.step(str(action))
        return obs, float(reward), bool(terminated), bool(truncated), dict(info)

    def solution(self) -> list[str] | None:
        """The environment's reference actions for the current episode, one per step, as
        spade-async's feasibility gate reads ``solution()``; None for free-text guidance."""
        return solution_actions(self._env.solution())

    def get_tools(self) -> list[dict]:
        """Tool schemas of a tool-use environment (empty for games)."""
        if self.sandboxed:
            return self._env._portal.call(self._env._pool.get_tools, self._env._inst)
        get = getattr(self._env, "get_tools", None)
        return list(get()) if callable(get) else []

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None and callable(getattr(env, "close", None)):
            env.close()
        super().close()
