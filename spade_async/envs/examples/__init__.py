"""Bundled hand-written environments: the fixed-pool baseline and the designer's few-shot set.

Each ``*.py`` file here is one environment meeting docs/environments.md (standard library only).
``EXAMPLES`` maps file name -> (skill, setting). Tool-use files subclass ``ToolUseBaseEnv``
without importing it, as the reference's generated files do: the sandbox injects it.

These files are trusted and may be loaded in-process with ``load_env_class`` (tests, the
in-process side of benchmarks); model-written code only ever runs in the sandbox.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from spade_async.errors import UsageError
from spade_async.roles.prompts import SKILLS  # the six game skills of docs/method.md

HERE = Path(__file__).resolve().parent
SETTINGS = ("games", "tool_use")

# file name -> (skill, setting)
EXAMPLES: dict[str, tuple[str, str]] = {
    "modular_lock.py": ("Mathematical_Reasoning", "games"),
    "polynomial_probe.py": ("Mathematical_Reasoning", "games"),
    "mastermind.py": ("Logical_Deduction", "games"),
    "liar_lineup.py": ("Logical_Deduction", "games"),
    "fog_maze.py": ("Spatial_Reasoning", "games"),
    "battleship.py": ("Spatial_Reasoning", "games"),
    "sequence_oracle.py": ("Pattern_Recognition", "games"),
    "vigenere_oracle.py": ("Pattern_Recognition", "games"),
    "peak_finder.py": ("Optimization", "games"),
    "bin_packing.py": ("Optimization", "games"),
    "switchboard.py": ("Causal_Inference", "games"),
    "plant_lab.py": ("Causal_Inference", "games"),
    "order_ledger_tool.py": ("Mathematical_Reasoning", "tool_use"),
    "flight_planner_tool.py": ("Optimization", "tool_use"),
    "org_chart_tool.py": ("Logical_Deduction", "tool_use"),
}


def example_paths(setting: str | None = None, skill: str | None = None) -> list[Path]:
    """Paths of the bundled environments, optionally filtered by setting and skill."""
    if setting is not None and setting not in SETTINGS:
        raise UsageError(f"unknown setting {setting!r}; use one of {', '.join(SETTINGS)}")
    if skill is not None and skill not in SKILLS:
        raise UsageError(f"unknown skill {skill!r}; use one of {', '.join(SKILLS)}")
    return [
        HERE / name
        for name, (sk, st) in EXAMPLES.items()
        if (setting is None or st == setting) and (skill is None or sk == skill)
    ]


def skill_of(path: str | Path) -> str:
    """The skill a bundled example exercises (by file name)."""
    name = Path(path).name
    if name not in EXAMPLES:
        raise UsageError(f"{name!r} is not a bundled example; see EXAMPLES in {__name__}")
    return EXAMPLES[name][0]


def load_env_class(path: str | Path) -> type:
    """Execute a TRUSTED environment file in-process and return its ``...Env`` class.

    Mirrors the sandbox's namespace: ``ToolUseBaseEnv`` and the common modules are injected.
    Never use this on model-written code.
    """
    from spade_async.envs.tool_use import ToolUseBaseEnv

    path = Path(path)
    namespace = {"__name__": f"spade_example_{path.stem}", "__file__": str(path)}
    namespace.update(ToolUseBaseEnv=ToolUseBaseEnv, random=random, re=re, json=json, math=math)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    found = [
        v
        for k, v in namespace.items()
        if isinstance(v, type)
        and k.endswith("Env")
        and v is not ToolUseBaseEnv
        and hasattr(v, "reset")
        and hasattr(v, "step")
    ]
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise UsageError(f"{path} defines {len(found)} environment classes {names}; expected 1")
    return found[0]
