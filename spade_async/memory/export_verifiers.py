"""``spade memory export DEST --format verifiers``: a verifiers environment package.

    DEST/pyproject.toml  README.md          (the model-written-code warning first)
    DEST/<pkg>/__init__.py                  load_environment(): a vf.MultiTurnEnv
    DEST/<pkg>/envs/, _runtime.py, _tool_use.py, metadata.json   (export_common)

``pip install DEST`` and ``verifiers.load_environment("<pkg>")`` loads it (verifiers' own
loader imports the module and calls ``load_environment``; the classic API of verifiers
0.1-0.2). The dataset has one task per (environment, seed): its prompt is the environment's
first observation, ``info`` names the environment and the seed. In a rollout ``setup_state``
opens the environment (``_runtime.open_env``: spade-async's sandbox, or the loud opt-in) and
resets it to the task's seed; ``env_response`` steps it with the model's last reply and
answers with the observation; the episode ends when the environment says terminated or
truncated (``final_env_response``) or at ``max_turns``. The rubric's one reward function is
the environment's reward of the last step, exactly.
"""

from __future__ import annotations

from pathlib import Path

from spade_async.memory.export_common import NOTE, environments_literal, write_envs, write_pyproject
from spade_async.memory.records import EnvRecord

_INIT = '''{note!r}

import asyncio
import uuid

import verifiers as vf
from datasets import Dataset

from ._runtime import open_env

NOTE = {note!r}
ENVIRONMENTS = {environments}
SEEDS = {seeds}
_OPEN = {{}}  # rollout key -> the environment it plays


def _content(message):
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "")
                          for p in content)
    return content or ""


class SpadeMultiTurnEnv(vf.MultiTurnEnv):
    """A SPADE environment played turn by turn: the environment's reward is the reward."""

    async def setup_state(self, state, **kwargs):
        info = state["info"]
        key = uuid.uuid4().hex
        env = await asyncio.to_thread(open_env, ENVIRONMENTS[info["env"]])
        _OPEN[key] = env
        await asyncio.to_thread(env.reset, seed=int(info["seed"]))
        state["spade_key"] = key
        state["spade_reward"] = 0.0
        state["spade_done"] = False
        return state

    async def env_response(self, messages, state, **kwargs):
        env = _OPEN[state["spade_key"]]
        obs, reward, terminated, truncated, _ = await asyncio.to_thread(
            env.step, _content(messages[-1])
        )
        state["spade_reward"] = float(reward)
        reply = [vf.UserMessage(content=obs)] if hasattr(vf, "UserMessage") else [
            {{"role": "user", "content": obs}}
        ]
        if terminated or truncated:
            state["spade_done"] = True
            state["final_env_response"] = reply
        return reply

    @vf.cleanup
    async def close_spade_env(self, state, **kwargs):
        env = _OPEN.pop(state.get("spade_key"), None)
        if env is not None:
            await asyncio.to_thread(env.close)


def spade_reward(state, **kwargs) -> float:
    """The environment's own reward at the end of the episode."""
    return float(state.get("spade_reward", 0.0))


def first_observation(name, seed):
    env = open_env(ENVIRONMENTS[name])
    try:
        return env.reset(seed=seed)[0]
    finally:
        env.close()


def load_environment(env=None, seeds=None, max_turns=25, **kwargs):
    """A vf.MultiTurnEnv over the exported environments (or the one named ``env``), one task
    per seed (default: each environment's validation seeds)."""
    names = [env] if env else list(ENVIRONMENTS)
    rows = []
    for name in names:
        if name not in ENVIRONMENTS:
            raise ValueError(f"no environment {{name!r}}; choose one of {{sorted(ENVIRONMENTS)}}")
        opened = open_env(ENVIRONMENTS[name])
        try:
            for seed in (list(seeds) if seeds is not None else SEEDS[name]):
                prompt = opened.reset(seed=int(seed))[0]
                rows.append({{"prompt": [{{"role": "user", "content": prompt}}], "answer": "",
                             "info": {{"env": name, "seed": int(seed)}}}})
        finally:
            opened.close()
    rubric = vf.Rubric(funcs=[spade_reward], weights=[1.0])
    return SpadeMultiTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric,
                             max_turns=max_turns, **kwargs)
'''


def export_verifiers(records: list[EnvRecord], dest: Path, *, run_dir: Path,
                     name: str | None = None) -> dict:  # fmt: skip

    pkg, metas = write_envs(records, dest, run_dir=run_dir, name=name)
    seeds = {m["name"]: list(m["validation"]["seeds"]) for m in metas}
    (dest / pkg / "__init__.py").write_text(
        _INIT.format(note=NOTE, environments=environments_literal(metas), seeds=repr(seeds))
    )
    write_pyproject(dest, pkg, run_dir, what="a verifiers environment",
                    deps=["verifiers>=0.1.3,<0.3", "datasets"], packages=[pkg, f"{pkg}.envs"])  # fmt: skip
    names = "\n".join(f"- `{m['name']}` (seeds {m['validation']['seeds']})" for m in metas)
    (dest / "README.md").write_text(
        f"# {pkg}\n\n**{NOTE}**\n\nA verifiers environment: `pip install .`, then\n\n"
        f"    import verifiers as vf\n    env = vf.load_environment({pkg!r})\n\n"
        "A multi-turn environment, one task per seed; the reward is the environment's own.\n\n"
        f"Environments:\n\n{names}\n"
    )
    return {"package": pkg, "environments": len(metas), "dest": str(dest), "note": NOTE}
