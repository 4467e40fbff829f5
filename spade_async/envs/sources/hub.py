"""Shared by ``gym:`` and ``gem:``: the environment source that wraps a hub environment, and
the check, in a child process, that its observations and actions are text.

The source (``wrapper``) imports the hub library inside the sandbox worker and makes the
environment by its id (a literal); ``reset``/``step`` pass through with the observation as
text, the reward as a float, a turn cap (``max_turns``, truncated) and an info dict reduced to
plain values. ``solution()`` is the environment's own ``solution()`` when it has one (on the
unwrapped env); otherwise free text, which the gates mark "unverified".

``probe`` makes the environment once in a child interpreter with a wall-clock budget: a
missing id or non-text spaces is a ``SourceError`` (nothing stored); a probe that hangs or
crashes says nothing, and the gates, which run the same code sandboxed, reject it as they
reject a generated environment.
"""

from __future__ import annotations

import json
import subprocess
import sys

from spade_async.envs.sources import SourceError, class_name, literal

PROBE_TIMEOUT_S = 60

_BODY = '''

def _text(obs):
    if not isinstance(obs, str):
        raise TypeError(f"the observation is {{type(obs).__name__}}, not text")
    return obs


def _plain(info):
    out = {{}}
    for key, value in dict(info or {{}}).items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[str(key)] = value
        else:
            out[str(key)] = str(value)[:500]
    return out


class {cls}:
    """A {what} environment, made by its id inside the sandbox worker."""

    def __init__(self, max_turns=MAX_TURNS, **kwargs):
        self.max_turns = max(1, int(max_turns))
        self._env = _make()
        self.turn = 0

    def reset(self, seed=None):
        self.turn = 0
        obs, info = self._env.reset(seed=seed)
        return _text(obs), _plain(info)

    def step(self, action):
        self.turn += 1
        obs, reward, terminated, truncated, info = self._env.step(str(action))
        truncated = bool(truncated) or (self.turn >= self.max_turns and not terminated)
        return _text(obs), float(reward), bool(terminated), truncated, _plain(info)

    def solution(self):
        own = getattr(getattr(self._env, "unwrapped", self._env), "solution", None)
        return own() if callable(own) else ""

    def close(self):
        close = getattr(self._env, "close", None)
        if callable(close):
            close()
'''


def wrapper(*, what: str, imports: str, make: str, env_id: str, origin: str, skill: str,
            max_turns: int) -> str:  # fmt: skip
    head = [
        f'"""A {what} environment, wrapped by spade-async (spade_async/envs/sources/hub.py).',
        "",
        'Every value below is a literal written by the importer."""',
        "",
        imports,
        "",
        f"SKILL = {literal(skill)}",
        f"ORIGIN = {literal(origin)}",
        f"ENV_ID = {literal(env_id)}",
        f"MAX_TURNS = {literal(max_turns)}",
        "",
        "",
        make.rstrip(),
    ]
    return "\n".join(head) + "\n" + _BODY.format(cls=class_name(env_id), what=what)


_PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
kind, env_id = sys.argv[1], sys.argv[2]
out = {}
try:
    if kind == "gym":
        import gymnasium
        from gymnasium import spaces
        env = gymnasium.make(env_id, disable_env_checker=True)
        for name in ("observation_space", "action_space"):
            space = getattr(env, name, None)
            if not isinstance(space, spaces.Text):
                out["not_text"] = f"{name} is {type(space).__name__}"
                break
    else:
        import gem
        env = gem.make(env_id)
    if "not_text" not in out:
        obs, _ = env.reset(seed=0)
        if not isinstance(obs, str):
            out["not_text"] = f"reset() observation is {type(obs).__name__}"
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
print(json.dumps(out))
"""


def probe(value: str, kind: str, env_id: str, fix: str) -> None:
    """``SourceError`` when the environment cannot be made here or is not text."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, kind, env_id],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
        )  # fmt: skip
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return  # hangs or crashes: the gates judge it, sandboxed
    if "not_text" in out:
        raise SourceError(
            f"{value!r}: {env_id!r} is not a text environment ({out['not_text']}); "
            "choose one whose observations and actions are text (gymnasium.spaces.Text)"
        )
    if "error" in out:
        raise SourceError(f"{value!r}: {env_id!r} cannot be made ({out['error']}); {fix}")
