"""The BFCL multi-turn episode as a sandboxed environment (source assembled at run time).

The executable API classes come verbatim from ``bfcl_eval``'s ``func_source_code`` (read
with importlib.resources, their package imports stripped, ``mpmath`` replaced by a tiny
``decimal`` shim: the sandbox has the standard library only). The episode class below
executes model calls against them and checks each turn as BFCL's ``multi_turn_checker``
does: after a turn whose ground truth is non-empty, (1) the model made calls, (2) every
public attribute of every model instance equals the ground-truth instance's (state check),
(3) the ground truth's execution results are an unordered sub-multiset of all the model's
results so far (response check). The first failing turn ends the episode with reward 0.
Calls are dispatched by name to public methods (``getattr``), never through ``eval``.
"""

from __future__ import annotations

import importlib.resources
import re

__all__ = ["episode_source", "CLASS_FILES"]

CLASS_FILES = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api",
    "MessageAPI": "message_api", "TwitterAPI": "posting_api", "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot", "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}  # fmt: skip
STATELESS = {"MathAPI"}
_PKG_IMPORT = re.compile(r"^from bfcl_eval\.[\w.]+\.long_context import", re.M)

_LOADER = r"""
import sys as _sys
import types as _types


def _module(name, source):
    mod = _types.ModuleType(name)
    _sys.modules[name] = mod
    exec(compile(source, "<bfcl " + name + ">", "exec"), mod.__dict__)
    return mod


class _MPContext:
    dps = 15


def _mp_log(x):  # the one mpmath use in math_api (mp.dps and log), through decimal
    import decimal
    with decimal.localcontext() as c:
        c.prec = max(1, int(_MPContext.dps))
        return decimal.Decimal(x).ln()


_mpmath = _types.ModuleType("mpmath")
_mpmath.mp, _mpmath.log = _MPContext, _mp_log
_sys.modules["mpmath"] = _mpmath
"""

_EPISODE = r"""
import copy as _copy
import json as _json

_CLASSES = {%CLASSES%}
_STATELESS = {%STATELESS%}


def _as_result(value):
    if type(value) == str:
        return value
    if type(value) == dict:
        try:
            return _json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def _sub_multiset(want, have):
    pool = list(have)
    for item in want:
        if item not in pool:
            return False
        pool.remove(item)
    return True


class BfclEpisodeEnv:
    def __init__(self, max_turns: int = 1, entry=None, **kwargs):
        self.entry = entry or {"initial_config": {}, "involved_classes": [], "ground_truth": [[]],
                               "long_context": False}

    def _instances(self):
        out = {}
        for name in self.entry["involved_classes"]:
            inst = _CLASSES[name]()
            if name not in _STATELESS:
                cfg = _copy.deepcopy(self.entry["initial_config"].get(name, {}))
                inst._load_scenario(cfg, long_context=self.entry["long_context"])
            out[name] = inst
        return out

    def reset(self, seed=None):
        self.model, self.truth = self._instances(), self._instances()
        self.turn, self.results, self.turn_calls = 0, [], 0
        return "turn 0", {}

    def _execute(self, instances, calls):
        methods = {}
        for inst in instances.values():
            for attr in dir(inst):
                if not attr.startswith("_") and callable(getattr(inst, attr)):
                    methods[attr] = getattr(inst, attr)
        out = []
        for name, args, kwargs in calls:
            fn = methods.get(name)
            if fn is None:
                out.append(f"Error during execution: name '{name}' is not defined")
                continue
            try:
                out.append(_as_result(fn(*args, **kwargs)))
            except Exception as e:
                out.append(f"Error during execution: {e}")
        return out

    def _check_turn(self):
        truth_calls = self.entry["ground_truth"][self.turn]
        truth_results = self._execute(self.truth, truth_calls)
        if not truth_calls:
            return None
        if self.turn_calls == 0:
            return "empty_turn_model_response"
        for name, want in self.truth.items():
            have = self.model[name]
            for attr, value in vars(want).items():
                if not attr.startswith("_") and getattr(have, attr, None) != value:
                    return f"instance_state_mismatch: {name}.{attr}"
        if not _sub_multiset(truth_results, self.results):
            return "execution_response_mismatch"
        return None

    def step(self, action):
        msg = _json.loads(action)
        if "calls" in msg:
            results = self._execute(self.model, msg["calls"])
            self.results.extend(results)
            self.turn_calls += len(msg["calls"])
            return _json.dumps(results), 0.0, False, False, {}
        failure = self._check_turn()
        if failure is not None:
            return f"turn {self.turn} failed: {failure}", 0.0, True, False, {"failure": failure}
        self.turn += 1
        self.turn_calls = 0
        done = self.turn >= len(self.entry["ground_truth"])
        return f"turn {self.turn}", 1.0 if done else 0.0, done, False, {}

    def solution(self):
        return ""
"""


def episode_source() -> str:
    """Long-context data + the eight API classes + the episode environment, stdlib only."""
    root = importlib.resources.files("bfcl_eval") / "eval_checker" / "multi_turn_eval"
    root = root / "func_source_code"
    # each module keeps its own namespace (their top-level imports collide: ``datetime``)
    lines = [_LOADER]
    for module in ("long_context", *dict.fromkeys(CLASS_FILES.values())):
        text = (root / f"{module}.py").read_text(encoding="utf-8")
        text = _PKG_IMPORT.sub("from long_context import", text)
        lines.append(f"_m_{module} = _module({module!r}, {text!r})")
    parts = ["\n".join(lines)]
    classes = ", ".join(f"{n!r}: _m_{m}.{n}" for n, m in CLASS_FILES.items())
    episode = _EPISODE.replace("%CLASSES%", classes).replace(
        "%STATELESS%", repr(sorted(STATELESS))[1:-1]
    )
    return "\n\n".join(parts) + episode
