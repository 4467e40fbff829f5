"""A sandboxed environment as a ``gymnasium.Env`` with ``Text`` spaces.

    env = SandboxedEnv(source)           # its own pool (one worker) on a blocking portal
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(r"\\boxed{42}")
    env.close()

Side effects: a background thread runs an anyio event loop (``start_blocking_portal``) that
owns the pool; ``close()`` stops it and kills the worker. Observations are clipped to
``max_obs_length`` and characters outside the space's charset (printable ASCII plus
whitespace) become ``?`` so they always lie in ``observation_space``. Environment failures
raise ``EnvError`` (kind timeout, crash, ...), as any gymnasium env would raise.
"""

from __future__ import annotations

import string
from typing import Any

import anyio.from_thread
import gymnasium
from gymnasium import spaces

from spade_async.envs.pool import EnvPool, PoolConfig

__all__ = ["SandboxedEnv", "CHARSET"]

CHARSET = frozenset(string.printable)  # letters, digits, punctuation, space, \t \n \r \x0b \x0c


def _fit(text: str, max_length: int) -> str:
    text = text[:max_length]
    if all(c in CHARSET for c in text):
        return text
    return "".join(c if c in CHARSET else "?" for c in text)


class SandboxedEnv(gymnasium.Env[str, str]):
    metadata = {"render_modes": []}

    def __init__(
        self, source: str, *, env_id: str | None = None, kwargs: dict | None = None,
        pool_config: PoolConfig | None = None, max_obs_length: int = 16_384,
        max_action_length: int = 4_096,
    ) -> None:  # fmt: skip
        self.observation_space = spaces.Text(
            max_length=max_obs_length, min_length=0, charset=CHARSET
        )
        self.action_space = spaces.Text(max_length=max_action_length, min_length=0, charset=CHARSET)
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            config = pool_config or PoolConfig(prewarm=0, max_workers=1)
            self._pool_cm = self._portal.wrap_async_context_manager(EnvPool(config))
            self._pool = self._pool_cm.__enter__()
            self._inst = self._portal.call(self._pool.open, source, env_id, kwargs)
        except BaseException:
            self.close()
            raise
        self.env_class = self._inst.env_class
        self.isolation = self._pool.isolation

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        env_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        obs, info = self._portal.call(self._pool.reset, self._inst, env_seed)
        return _fit(obs, self.observation_space.max_length), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, term, trunc, info = self._portal.call(self._pool.step, self._inst, str(action))
        return _fit(obs, self.observation_space.max_length), float(reward), term, trunc, info

    def solution(self) -> str | list[str]:
        return self._portal.call(self._pool.solution, self._inst)

    def close(self) -> None:
        pool_cm, self._pool_cm = getattr(self, "_pool_cm", None), None
        portal_cm, self._portal_cm = getattr(self, "_portal_cm", None), None
        if pool_cm is not None:
            pool_cm.__exit__(None, None, None)
        if portal_cm is not None:
            portal_cm.__exit__(None, None, None)
        super().close()
