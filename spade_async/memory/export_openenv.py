"""``spade memory export DEST --format openenv``: an OpenEnv environment (openenv-core).

    DEST/openenv.yaml               the manifest (name, runtime fastapi, app, port)
    DEST/pyproject.toml  README.md  (the model-written-code warning first)
    DEST/<pkg>/models.py            typed SpadeAction(text) / SpadeObservation(text, truncated,
                                    env, info) / SpadeState(env, seed) (openenv's pydantic bases)
    DEST/<pkg>/client.py            SpadeEnvClient: openenv's EnvClient for those types
    DEST/<pkg>/server/environment.py  SpadeEnvironment: reset(seed, env=NAME) / step / state
    DEST/<pkg>/server/app.py        create_app(...): the HTTP + WebSocket server
    DEST/<pkg>/envs/, _runtime.py, _tool_use.py, metadata.json   (export_common)

One server serves every exported environment: ``reset(env=NAME, seed=S)`` picks one (the
first by default) and a seed picks its task; ``step`` returns the environment's own
observation, reward and terminated/truncated (``done`` = either). Each session's environment
runs in spade-async's sandbox (``_runtime.open_env``; without spade-async only with the loud
opt-in). Serve it on loopback: ``uvicorn <pkg>.server.app:app --host 127.0.0.1``.
"""

from __future__ import annotations

from pathlib import Path

from spade_async.memory.export_common import NOTE, environments_literal, write_envs, write_pyproject
from spade_async.memory.records import EnvRecord

_MODELS = '''"""Typed action, observation and state of the exported SPADE environments."""

from typing import Any, Dict

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class SpadeAction(Action):
    text: str = Field(description="the agent's whole reply (games read its \\\\boxed{...})")


class SpadeObservation(Observation):
    text: str = Field(default="", description="the environment's observation")
    truncated: bool = Field(default=False, description="the episode was cut (turn cap)")
    env: str = Field(default="", description="the environment this session plays")
    info: Dict[str, Any] = Field(default_factory=dict, description="the environment's info")


class SpadeState(State):
    env: str = ""
    seed: int | None = None
'''

_CLIENT = '''"""OpenEnv client of the exported SPADE environments (openenv's own EnvClient)."""

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import SpadeAction, SpadeObservation, SpadeState


class SpadeEnvClient(EnvClient[SpadeAction, SpadeObservation, SpadeState]):
    def _step_payload(self, action: SpadeAction) -> Dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[SpadeObservation]:
        obs = SpadeObservation(
            **payload.get("observation", {}), reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=obs, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: Dict[str, Any]) -> SpadeState:
        return SpadeState(**payload)
'''

_ENVIRONMENT = '''"""The server side: one SPADE environment per session, run through ``_runtime.open_env``."""

import uuid
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment

from .._runtime import open_env
from ..models import SpadeAction, SpadeObservation, SpadeState

ENVIRONMENTS = {environments}


class SpadeEnvironment(Environment[SpadeAction, SpadeObservation, SpadeState]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # every session opens its own sandboxed instance

    def __init__(self):
        super().__init__()
        self._env = None
        self._name = ""
        self._state = SpadeState()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              env: Optional[str] = None, **kwargs: Any) -> SpadeObservation:
        name = env or next(iter(ENVIRONMENTS))
        if name not in ENVIRONMENTS:
            raise ValueError(f"no environment {{name!r}}; choose one of {{sorted(ENVIRONMENTS)}}")
        if self._env is None or name != self._name:
            self.close()
            self._env, self._name = open_env(ENVIRONMENTS[name]), name
        seed = 0 if seed is None else int(seed)
        text, info = self._env.reset(seed=seed)
        self._state = SpadeState(episode_id=episode_id or uuid.uuid4().hex, step_count=0,
                                 env=name, seed=seed)
        return SpadeObservation(text=text, env=name, info=info, done=False, reward=None)

    def step(self, action: SpadeAction, timeout_s: Optional[float] = None,
             **kwargs: Any) -> SpadeObservation:
        if self._env is None:
            raise RuntimeError("call reset() first")
        text, reward, terminated, truncated, info = self._env.step(action.text)
        self._state.step_count += 1
        return SpadeObservation(text=text, env=self._name, info=info, truncated=truncated,
                                done=bool(terminated or truncated), reward=float(reward))

    @property
    def state(self) -> SpadeState:
        return self._state

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()
'''

_APP = '''"""``uvicorn {pkg}.server.app:app --host 127.0.0.1 --port 8000``"""

from openenv.core.env_server.http_server import create_app

from ..models import SpadeAction, SpadeObservation
from .environment import SpadeEnvironment

app = create_app(SpadeEnvironment, SpadeAction, SpadeObservation, env_name={pkg!r})
'''


def export_openenv(records: list[EnvRecord], dest: Path, *, run_dir: Path,
                   name: str | None = None) -> dict:  # fmt: skip

    pkg, metas = write_envs(records, dest, run_dir=run_dir, name=name)
    root = dest / pkg
    (root / "server").mkdir(exist_ok=True)
    (root / "models.py").write_text(_MODELS)
    (root / "client.py").write_text(_CLIENT)
    (root / "server" / "__init__.py").write_text("")
    (root / "server" / "environment.py").write_text(
        _ENVIRONMENT.format(environments=environments_literal(metas))
    )
    (root / "server" / "app.py").write_text(_APP.format(pkg=pkg))
    (root / "__init__.py").write_text(
        f"{NOTE!r}\n\nfrom .client import SpadeEnvClient\n"
        "from .models import SpadeAction, SpadeObservation, SpadeState\n\n"
        f"ENVIRONMENTS = {environments_literal(metas)}\n"
    )
    (dest / "openenv.yaml").write_text(
        f"spec_version: 1\nname: {pkg}\ntype: space\nruntime: fastapi\n"
        f"app: {pkg}.server.app:app\nport: 8000\n"
    )
    write_pyproject(dest, pkg, run_dir, what="an OpenEnv server", deps=["openenv-core>=0.3"],
                    packages=[pkg, f"{pkg}.envs", f"{pkg}.server"])  # fmt: skip
    names = "\n".join(f"- `{m['name']}` ({m['module']})" for m in metas)
    (dest / "README.md").write_text(
        f"# {pkg}\n\n**{NOTE}**\n\nAn OpenEnv environment server. Serve it on loopback:\n\n"
        f"    pip install . && uvicorn {pkg}.server.app:app --host 127.0.0.1 --port 8000\n\n"
        f"and drive it with `{pkg}.SpadeEnvClient(base_url='http://127.0.0.1:8000')`: "
        "`reset(env=NAME, seed=S)`, `step(SpadeAction(text=...))`, `state()`.\n\n"
        f"Environments:\n\n{names}\n"
    )
    return {"package": pkg, "environments": len(metas), "dest": str(dest), "note": NOTE}
