"""ACEBench's agent scenes, from the user's checkout, as one sandboxed environment.

``find_checkout(DIR)`` reads the checkout without executing any of it: the data files, and
from ACEBench's own modules (parsed with ``ast``, literals only) the class-to-module maps
(``CLASS_FILE_PATH_MAPPING_EN`` in ``model_inference/multi_step/multi_step_utils.py`` and
``model_inference/multi_turn/multi_turn_utils.py``), the attributes that make a class's
end state (``SAVED_CLASS`` in ``model_inference/apimodel_inference.py``) and the domain
rules appended to the multi-turn agent's prompt (``BASE_PROMPT_EN``, ``TRAVEL_PROMPT_EN``
in ``model_inference/prompt_en.py``).

``episode_source(checkout)`` is the environment the sandbox worker loads: every scenario
module's source text served by an import hook under its package path (the modules import
each other as ``model_inference.multi_turn.scenariosen...``), then ``AceEpisodeEnv``, which
builds the involved classes as ACEBench's ``execute_agent_func_call`` does (each instance
loads its own initial config, then ``BaseApi``'s), dispatches a call by name to the public
method of every involved instance that has one (the last one's result is the reply, as
ACEBench does: ``turn_on_wifi`` reaches every class), and returns the end state (the saved
attributes, through JSON) when asked. Calls never go through ``eval``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from spade_async.errors import SpadeError

__all__ = ["Checkout", "find_checkout", "episode_source", "ACE_FORMAT", "CATEGORIES"]

CATEGORIES = ("multi_step", "multi_turn")
ACE_FORMAT = (
    "a clone of github.com/ACEBench/ACEBench (its root, or its data_all/data_en folder) with "
    "data_agent_multi_step.json, data_agent_multi_turn.json (JSON lines) and possible_answer/ "
    "for both, and model_inference/ (the scenario classes); pass --data acebench_agent=DIR"
)
_UTILS = {c: f"model_inference/{c}/{c}_utils.py" for c in CATEGORIES}
_SAVED = "model_inference/apimodel_inference.py"
_PROMPTS = "model_inference/prompt_en.py"


@dataclass
class Checkout:
    root: Path
    data: Path
    modules: dict[str, dict[str, str]]  # category -> class name -> dotted module path
    saved: dict[str, list[str]]  # class name -> attributes compared at the end
    prompts: dict[str, str]  # "BaseApi"/"Travel" -> domain rules for the multi-turn agent
    sources: dict[str, str] = field(default_factory=dict)  # dotted module -> source text


def _literal(path: Path, name: str) -> object:
    """The literal assigned to ``name`` at the top of ``path``, without running the file."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as exc:
        raise SpadeError(f"{path}: cannot read it ({exc}); expected {ACE_FORMAT}") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                break
    raise SpadeError(f"{path}: no literal {name} = ... found; expected {ACE_FORMAT}")


def _locate(path: Path) -> tuple[Path, Path]:
    """``(root, data folder)`` from the checkout root or its ``data_all/data_en``."""
    if (path / "data_agent_multi_step.json").is_file():
        return path.resolve().parents[1], path
    return path, path / "data_all" / "data_en"


def find_checkout(path: str | None) -> Checkout:
    p = Path(path or "")
    if not path or not p.is_dir():
        raise SpadeError(f"suite acebench_agent has no data folder: expected {ACE_FORMAT}")
    root, data = _locate(p)
    need = [data / f"data_agent_{c}.json" for c in CATEGORIES]
    need += [data / "possible_answer" / f"data_agent_{c}.json" for c in CATEGORIES]
    need += [root / f for f in (*_UTILS.values(), _SAVED, _PROMPTS)]
    missing = [str(f) for f in need if not f.is_file()]
    if missing:
        raise SpadeError(f"suite acebench_agent: {missing[0]} is missing; expected {ACE_FORMAT}")
    modules = {c: _literal(root / _UTILS[c], "CLASS_FILE_PATH_MAPPING_EN") for c in CATEGORIES}
    saved = _literal(root / _SAVED, "SAVED_CLASS")
    prompts = {}
    for cls, var in (("BaseApi", "BASE_PROMPT_EN"), ("Travel", "TRAVEL_PROMPT_EN")):
        prompts[cls] = _literal(root / _PROMPTS, var)
    ok = all(
        isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
        for m in modules.values()
    ) and isinstance(saved, dict) and all(isinstance(v, str) for v in prompts.values())  # fmt: skip
    if not ok:
        raise SpadeError(
            f"{root}: class maps or SAVED_CLASS of an unexpected shape; expected {ACE_FORMAT}"
        )
    co = Checkout(root=root, data=data, modules=modules, saved=saved, prompts=prompts)
    co.sources = _sources(co)
    return co


def _sources(co: Checkout) -> dict[str, str]:
    """Every module under the scenario folders the class maps point into, by dotted name."""
    folders = set()
    for mapping in co.modules.values():
        for module in mapping.values():
            parts = module.split(".")
            folders.add(co.root.joinpath(*parts[: min(3, len(parts) - 1)]))
    out = {}
    for folder in sorted(folders):
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(co.root).with_suffix("").parts
            name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            out[name] = f.read_text(encoding="utf-8")
    for mapping in co.modules.values():
        for cls, module in mapping.items():
            if module not in out:
                raise SpadeError(
                    f"{co.root}: class {cls}'s module {module} has no file "
                    f"{module.replace('.', '/')}.py; expected {ACE_FORMAT}"
                )
    return out


_HOOK = r"""
import copy as _copy
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import inspect as _inspect
import json as _json
import sys as _sys

_SOURCES = %SOURCES%
_PACKAGES = {n.rsplit(".", i)[0] for n in _SOURCES for i in range(1, n.count(".") + 1)}


class _ScenarioImporter(_abc.MetaPathFinder, _abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES or name in _PACKAGES:
            return _util.spec_from_loader(name, self, is_package=name in _PACKAGES)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = _SOURCES.get(module.__name__)
        if source is not None:
            exec(compile(source, "<acebench " + module.__name__ + ">", "exec"), module.__dict__)


_sys.meta_path.insert(0, _ScenarioImporter())
"""

_EPISODE = r"""


def _as_text(value):
    if type(value) == str:
        return value
    if type(value) == dict:
        try:
            return _json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def _parsed(text):
    try:
        return _json.loads(text)
    except Exception:
        return text


class AceEpisodeEnv:
    def __init__(self, max_turns: int = 1, entry=None, **kwargs):
        self.entry = entry or {"modules": {}, "involved_classes": [], "initial_config": {},
                               "saved": {}}

    def reset(self, seed=None):
        config = self.entry["initial_config"]
        self.instances, self.executed = {}, False
        for name in self.entry["involved_classes"]:
            module = _importlib.import_module(self.entry["modules"][name])
            inst = getattr(module, name)()
            inst._load_scenario(_copy.deepcopy(config.get(name, {})), long_context=False)
            inst._load_scenario(_copy.deepcopy(config.get("BaseApi", {})), long_context=False)
            self.instances[name] = inst
        return "ready", {}

    def _call(self, name, kwargs):
        if not isinstance(name, str) or name.startswith("_") or not isinstance(kwargs, dict):
            return "Error during execution: name '%s' is not defined" % (name,)
        targets = [i for i in self.instances.values()
                   if _inspect.ismethod(getattr(i, name, None))]
        if not targets:
            return "Error during execution: name '%s' is not defined" % (name,)
        try:
            for inst in targets:
                result = getattr(inst, name)(**kwargs)
        except Exception as e:
            return "Error during execution: " + str(e)
        return _as_text(result)

    def step(self, action):
        msg = _json.loads(action)
        if "calls" in msg:
            self.executed = True
            out = [_parsed(self._call(name, kwargs)) for name, kwargs in msg["calls"]]
            return _json.dumps(out, default=str), 0.0, False, False, {}
        state = []
        if self.executed:
            for name, inst in self.instances.items():
                keep = self.entry["saved"].get(name, [])
                state.append({name: {a: v for a, v in vars(inst).items() if a in keep}})
        return _json.dumps(state, default=str), 0.0, True, False, {}

    def solution(self):
        return ""
"""


def episode_source(co: Checkout) -> str:
    """The scenario modules behind an import hook, then the episode environment."""
    return _HOOK.replace("%SOURCES%", repr(co.sources)) + _EPISODE
