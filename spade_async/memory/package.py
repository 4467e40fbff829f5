"""``spade memory export --format gymnasium|jsonl``: the environment archive for others.

gymnasium: an installable Python package (``pip install DIR``)::

    DIR/pyproject.toml  README.md  (the model-written-code warning first)
    DIR/<pkg>/__init__.py          registers every environment: gymnasium.make("spade/<Name>-v0")
    DIR/<pkg>/_gym.py              the adapter (spade_async/memory/gym_template.py)
    DIR/<pkg>/_tool_use.py         the tool-use base class (spade_async/envs/tool_use.py)
    DIR/<pkg>/envs/<module>.py     one module per valid environment: its exact source,
                                   sha256 and METADATA (skill, win rate, regret, lineage,
                                   the validation verdict and seeds, solution rewards)
    DIR/<pkg>/metadata.json        every environment's METADATA

Before writing, each environment's ``solution()`` is played in the sandbox on its
validation seeds (reset, solution, reset, play) and the final reward recorded, so a user
can check the package reproduces it. gymnasium 1.x loads no plugins: ``import <pkg>``
registers the ids, or ``gymnasium.make("<pkg>:spade/<Name>-v0")`` imports it itself.

jsonl: one line per environment (code + the same metadata), for dataset use.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec

from spade_async.memory.records import EnvRecord, safe_id
from spade_async.safe_text import html_text, term

NOTE = (
    "WARNING: every environment in this package is model-written code (a SPADE designer "
    "model wrote it during training). It passed spade-async's validation gates, which are "
    "checks, not a security review. Run it sandboxed: with spade-async installed the "
    "environments run in its sandbox by default (sandbox='auto'); without it they run in "
    "your process and warn."
)
_SEEDS = re.compile(r"on seeds \[([\d, ]*)\]")


def package_name(run_dir: Path, name: str | None) -> str:
    raw = name or f"spade_envs_{run_dir.resolve().name}"
    pkg = re.sub(r"[^0-9A-Za-z_]+", "_", raw).strip("_").lower()  # an ASCII identifier
    return pkg if pkg and not pkg[0].isdigit() else f"spade_envs_{pkg}"


def gym_name(rec: EnvRecord) -> str:
    cls = re.sub(r"[^0-9A-Za-z_]", "", rec.env_class or "")[:64] or "Env"
    return f"{cls}_{rec.id[:8]}"


def validation_seeds(rec: EnvRecord, default: tuple[int, ...]) -> list[int]:
    m = _SEEDS.search(rec.reason or "")
    if m and m.group(1).strip():
        return [int(s) for s in m.group(1).split(",")]
    return list(default)


def metadata(rec: EnvRecord, seeds: list[int], exported: set[str], flagged: dict) -> dict:
    s = rec.stats
    return {
        "id": rec.id,
        "name": gym_name(rec),
        "env_class": rec.env_class,
        "skill": rec.skill,
        "setting": rec.setting,
        "origin": rec.origin.kind,
        "policy_version": rec.origin.policy_version,
        "win_rate": s.win_rate_nohint,
        "win_rate_hint": s.win_rate_hint,
        "regret": s.regret if s.regret_updates else None,
        "plays": {"hint": s.plays_hint, "nohint": s.plays_nohint},
        "designer_reward": s.designer_reward,
        "lineage": {
            "shown": list(rec.shown),
            "shown_exported": [i for i in rec.shown if i in exported],
        },
        "validation": {
            "valid": rec.valid,
            "stage": rec.stage,
            "reason": rec.reason,
            "feasibility": rec.feasibility,
            "multi_turn": rec.multi_turn,
            "seeds": seeds,
        },  # fmt: skip
        # episode replay (spade episode replay --all): None when none of its episodes was checked
        "replays": None if rec.id not in flagged else not flagged[rec.id],
        "doc_id": rec.doc_id,
        "hints": list(rec.hints),
    }


async def solution_rewards(records: list[EnvRecord], seeds: dict[str, list[int]]) -> dict:
    """id -> {seed: {"reward", "terminated", "steps"}} of replaying solution() in the
    sandbox; an environment whose solution is free text or fails gets an "error" entry."""
    from spade_async.envs.pool import EnvError, EnvPool, PoolConfig
    from spade_async.envs.validate import solution_actions

    out: dict[str, dict] = {}
    limiter = anyio.CapacityLimiter(4)
    async with EnvPool(PoolConfig(prewarm=0, max_workers=4)) as pool:

        async def one(rec: EnvRecord) -> None:
            res: dict[str, Any] = {}
            async with limiter:
                inst = None
                try:
                    inst = await pool.open(rec.code, env_id=rec.id)
                    for seed in seeds[rec.id]:
                        await pool.reset(inst, seed)
                        actions = solution_actions(await pool.solution(inst))
                        if actions is None:
                            res[str(seed)] = {"error": "solution() is free text"}
                            continue
                        await pool.reset(inst, seed)
                        reward, term, n = 0.0, False, 0
                        for a in actions:
                            _, reward, term, trunc, _ = await pool.step(inst, a)
                            n += 1
                            if term or trunc:
                                break
                        res[str(seed)] = {"reward": reward, "terminated": term, "steps": n}
                except EnvError as exc:
                    res["error"] = f"{exc.kind}: {exc.message[:200]}"
                finally:
                    if inst is not None:
                        await pool.close(inst)
            out[rec.id] = res

        async with anyio.create_task_group() as tg:
            for rec in records:
                tg.start_soon(one, rec)
    return out


def _flagged(run_dir: Path) -> dict[str, int]:
    """env id -> episodes of it that no longer replay, for every environment checked."""
    from spade_async.episodes.records import read_summary

    s = read_summary(run_dir)
    if s is None:
        return {}
    return {o.env_id: s.flagged_envs.get(o.env_id, 0) for o in s.outcomes}


def export_gymnasium(
    records: list[EnvRecord], dest: Path, *, run_dir: Path, name: str | None = None,
    default_seeds: tuple[int, ...] = (0, 1, 2),
) -> dict:  # fmt: skip
    """Write the package; returns {"package", "environments", "dest"}."""
    pkg = package_name(run_dir, name)
    valid = [r for r in records if r.status == "valid" and safe_id(r.id)]  # ids name files
    seeds = {r.id: validation_seeds(r, default_seeds) for r in valid}
    rewards = anyio.run(solution_rewards, valid, seeds)
    flagged = _flagged(run_dir)
    exported = {r.id for r in valid}
    root = dest / pkg
    (root / "envs").mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    (root / "_gym.py").write_text(gym_adapter_source())
    (root / "_tool_use.py").write_bytes((here.parent / "envs" / "tool_use.py").read_bytes())
    (root / "envs" / "__init__.py").write_text('"""One module per exported environment."""\n')
    metas = []
    for rec in valid:
        meta = metadata(rec, seeds[rec.id], exported, flagged)
        meta["solution_rewards"] = rewards.get(rec.id, {})
        meta["module"] = f"{pkg}.envs.{_module(rec)}"
        meta["gym_id"] = f"spade/{meta['name']}-v0"
        (root / "envs" / f"{_module(rec)}.py").write_text(
            _env_module(rec, meta, pkg), encoding="utf-8"
        )
        metas.append(meta)
    (root / "metadata.json").write_bytes(msgspec.json.format(msgspec.json.encode(metas)))
    (root / "__init__.py").write_text(_init(pkg, metas), encoding="utf-8")
    (dest / "pyproject.toml").write_text(_pyproject(pkg, run_dir), encoding="utf-8")
    (dest / "README.md").write_text(_readme(pkg, metas), encoding="utf-8")
    return {"package": pkg, "environments": len(metas), "dest": str(dest)}


def export_jsonl(records: list[EnvRecord], dest: Path, *, run_dir: Path,
                 default_seeds: tuple[int, ...] = (0, 1, 2)) -> dict:  # fmt: skip
    """``DEST/environments.jsonl``: one environment per line, code and metadata."""
    dest.mkdir(parents=True, exist_ok=True)
    flagged = _flagged(run_dir)
    records = [r for r in records if safe_id(r.id)]
    exported = {r.id for r in records}
    with open(dest / "environments.jsonl", "wb") as f:
        for rec in records:
            meta = metadata(rec, validation_seeds(rec, default_seeds), exported, flagged)
            line = {"note": NOTE, **meta, "status": rec.status, "code": rec.code}
            f.write(msgspec.json.encode(line) + b"\n")
    return {"environments": len(records), "dest": str(dest / "environments.jsonl")}


def _module(rec: EnvRecord) -> str:
    return f"env_{rec.id[:12]}"


def _env_module(rec: EnvRecord, meta: dict, pkg: str) -> str:
    import hashlib

    code = rec.code
    sha = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    cls = rec.env_class or ""
    doc = (
        f"{meta['name']}: a SPADE environment (skill {rec.skill or '-'!r}, {rec.setting!r}).\n\n"
        f"{NOTE}\n\nSOURCE is the environment file exactly as the designer wrote it (sha256 "
        f"{sha});\n``load()`` runs it in a module namespace with the names spade-async's "
        "sandbox injects.\n"
    )
    # every model-written value enters this source as a repr() literal (the docstring too:
    # a repr inside a triple-quoted string could close it), the package by a relative import
    return f'''{doc!r}

import json as _json

METADATA = _json.loads({msgspec.json.encode(meta).decode()!r})
SHA256 = {sha!r}
ENV_CLASS = {cls!r}
SOURCE = {code!r}


def load():
    """The environment class (executes SOURCE in this process: model-written code)."""
    import collections, copy, functools, heapq, itertools, json, math, random, re, string
    import sys, types, typing

    from .._tool_use import ToolUseBaseEnv

    module = types.ModuleType(__name__ + "._source")
    module.__dict__.update(
        random=random, re=re, json=json, math=math, collections=collections,
        itertools=itertools, functools=functools, string=string, copy=copy, heapq=heapq,
        typing=typing, Any=typing.Any, Optional=typing.Optional, Dict=typing.Dict,
        List=typing.List, Tuple=typing.Tuple, ToolUseBaseEnv=ToolUseBaseEnv,
    )
    sys.modules[module.__name__] = module
    exec(compile(SOURCE, __file__ + ":SOURCE", "exec"), module.__dict__)
    if ENV_CLASS:
        return module.__dict__[ENV_CLASS]
    found = [v for k, v in module.__dict__.items() if isinstance(v, type) and k.endswith("Env")
             and v.__module__ == module.__name__ and hasattr(v, "reset") and hasattr(v, "step")]
    if len(found) != 1:
        raise ImportError(f"{{__name__}}: expected one ...Env class, found {{len(found)}}")
    return found[0]
'''


def _init(pkg: str, metas: list[dict]) -> str:
    ids = {m["gym_id"]: m["module"] for m in metas}
    doc = (
        f"{pkg}: environments from a SPADE run, registered with gymnasium on import.\n\n"
        f'    import gymnasium, {pkg}\n    env = gymnasium.make("spade/<Name>-v0")'
        f'        # or gymnasium.make("{pkg}:spade/<Name>-v0")\n\n{NOTE}\n'
    )
    return f'''{doc!r}

import json
from pathlib import Path

import gymnasium

NOTE = {NOTE!r}
ENVIRONMENTS = {ids!r}


def metadata():
    """Every environment's metadata (skill, win rate, regret, lineage, validation, seeds)."""
    return json.loads((Path(__file__).parent / "metadata.json").read_text())


def register_envs():
    for gym_id, module in ENVIRONMENTS.items():
        if gym_id not in gymnasium.registry:
            gymnasium.register(id=gym_id, entry_point=__name__ + "._gym:SpadeTextEnv",
                               kwargs={{"module": module}}, disable_env_checker=False)


register_envs()
'''


def _pyproject(pkg: str, run_dir: Path) -> str:
    import tomli_w

    return tomli_w.dumps({
        "build-system": {"requires": ["setuptools>=61"],
                         "build-backend": "setuptools.build_meta"},
        "project": {
            "name": pkg.replace("_", "-"), "version": "0.1.0", "readme": "README.md",
            "description": f"Model-written environments from the SPADE run {run_dir.name} "
                           "(run them sandboxed)",
            "requires-python": ">=3.10", "dependencies": ["gymnasium>=1.0"],
        },
        "tool": {"setuptools": {"packages": [pkg, f"{pkg}.envs"],
                                "package-data": {pkg: ["metadata.json"]}}},
    })  # fmt: skip


def _cell(value: object) -> str:
    """A Markdown table cell: one line, no raw HTML, no column break."""
    return html_text(term(value)).replace("|", "\\|").replace("`", "&#96;")


def _readme(pkg: str, metas: list[dict]) -> str:
    def num(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    rows = "\n".join(
        f"| `{m['gym_id']}` | {_cell(m['skill'])} | {num(m['win_rate'], '.2f')} | "
        f"{num(m['regret'], '.3f')} |"
        for m in metas
    )
    return f"""# {pkg}

**{NOTE}**

    pip install .
    python -c "import gymnasium, {pkg}; env = gymnasium.make('{metas[0]["gym_id"] if metas else "spade/<Name>-v0"}')"

Each environment takes text actions (the agent's whole reply; games read `\\boxed{{...}}`)
and returns text observations. `env.unwrapped.solution()` gives the reference actions of
the current episode; `metadata.json` holds each environment's skill, win rate, regret,
lineage (the memory examples its designer prompt showed), validation verdict and seeds,
and the reward its solution reached on each seed when exported.

| id | skill | no-hint win rate | regret |
|---|---|---|---|
{rows}
"""


INLINE = (
    "from spade_async.envs.solution import solution_actions  # noqa: E402  (inlined by the export)"
)


def gym_adapter_source() -> str:
    """``gym_template.py`` with the solution rule (``envs/solution.py``) inlined in place of
    its import, so the package needs only the standard library and gymnasium."""
    from spade_async.envs import solution

    template = (Path(__file__).parent / "gym_template.py").read_text()
    body = Path(solution.__file__).read_text().split("from __future__ import annotations\n", 1)[1]
    if INLINE not in template:
        raise RuntimeError("gym_template.py lost the solution rule's import line")
    return template.replace(INLINE, body.strip() + "\n", 1)
