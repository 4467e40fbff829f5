"""ACEBench agent scoring, on plain JSON data (no user code runs here).

- ``parse_calls``: ACEBench's call format ``[ApiName(key='value', ...), ...]`` (keyword
  arguments; literals, a bare name reads as its text, as ACEBench's decoder does; positional
  arguments are dropped, as there), or ``<tool_call>{"name": ..., "arguments": {...}}``
  blocks. Parsed with ``ast``; nothing is evaluated.
- ``end_to_end``: ACEBench's ``agent_eval`` + ``agent_checker``: the end state lists one
  entry per involved class and must have as many as the gold; each gold class is compared
  with the model's class of the same name, attribute by attribute over the model's saved
  attributes (a dict-valued gold attribute: each gold key must be present and equal). A gold
  class that no model class is named like is not compared, as in ACEBench (its English data
  names ``ReminderAPI`` where the class is ``ReminderApi``).
- ``process_accuracy``: ACEBench's ``agent_eval_process``: the share of the gold milestones
  found in order among the agent's execution messages (the best of several alternatives);
  1.0 when the end state is right. A milestone matches when the text is equal, or, beyond
  ACEBench's exact text, when both parse to the same calls (so ``<tool_call>`` replies and
  spacing differences count).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

__all__ = ["parse_calls", "end_to_end", "process_accuracy"]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name):
        return node.id
    return ast.literal_eval(node)


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def parse_calls(text: str) -> list[list] | None:
    """``[[name, kwargs], ...]``, or None when ``text`` is not (only) function calls."""
    text = (text or "").strip()
    if "<tool_call>" in text:
        calls = []
        for body in _TOOL_CALL.findall(text):
            try:
                obj = json.loads(body)
                name, args = obj["name"], obj.get("arguments", {})
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if isinstance(name, str) and isinstance(args, dict):
                calls.append([name, args])
        return calls or None
    if not text:
        return None
    text = ("" if text.startswith("[") else "[") + text + ("" if text.endswith("]") else "]")
    try:
        node = ast.parse(text, mode="eval").body
        elts = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
        calls = []
        for e in elts:
            if not isinstance(e, ast.Call) or _name(e.func) is None:
                return None
            kwargs = {k.arg: _value(k.value) for k in e.keywords if k.arg is not None}
            calls.append([_name(e.func), kwargs])
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    return calls or None


def _state_errors(have: dict, want: dict) -> list[str]:
    name = next(iter(want))
    gold, model = want[name], have[name]
    if not isinstance(gold, dict) or not isinstance(model, dict):
        return [f"class {name}: state is not an attribute map"]
    errors = []
    for attr, value in model.items():
        if attr not in gold:
            errors.append(f"class {name}: attribute {attr} missing in the possible answer")
        elif isinstance(gold[attr], dict):
            if not isinstance(value, dict):
                errors.append(f"class {name}: {attr} is not a mapping")
                continue
            for key, v in gold[attr].items():
                if key not in value or value[key] != v:
                    errors.append(f"class {name}: {attr}.{key} wrong")
        elif gold[attr] != value:
            errors.append(f"class {name}: {attr} wrong")
    return errors


def end_to_end(state: list, gold: list) -> str | None:
    """None when the end state passes ACEBench's check, else the first failure."""
    if not isinstance(state, list) or len(state) != len(gold):
        n = len(state) if isinstance(state, list) else "no"
        return f"wrong number of classes: {n} against {len(gold)} in the possible answer"
    for want in gold:
        have = next(
            (s for s in state if isinstance(s, dict) and set(s) == set(want) and len(want) == 1),
            None,
        )
        if have is not None and (errors := _state_errors(have, want)):
            return errors[0]
    return None


def _same_step(model: str, stone: str) -> bool:
    if model.strip() == stone.strip():
        return True
    a, b = parse_calls(model), parse_calls(stone)
    return a is not None and a == b


def process_accuracy(steps: list[str], milestones: list) -> float:
    """The best in-order share of milestones among ``steps`` over the alternatives."""
    alternatives = milestones if milestones and isinstance(milestones[0], list) else [milestones]
    best = 0.0
    for alt in alternatives:
        if not alt:
            return 1.0
        found, i = 0, 0
        for stone in alt:
            while i < len(steps):
                i += 1
                if _same_step(steps[i - 1], stone):
                    found += 1
                    break
        best = max(best, found / len(alt))
    return best
