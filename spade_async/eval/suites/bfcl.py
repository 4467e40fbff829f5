"""BFCL-v4 multi-turn (base, miss_func, miss_param, long_context; 200 each) from ``bfcl-eval``.

Data and API classes ship inside the PyPI package (install it ``--no-deps``: its pins
conflict). Each episode runs in its own sandbox worker (``bfcl_env``); the model calls tools
as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several per reply allowed),
each reply's calls are executed there, and a reply without calls ends the user turn (at most
20 steps per turn, as BFCL). Held-out functions (miss_func) join the tool list at their turn
with BFCL's prompt. Reference in-loop settings: temperature 0.001, 4,096 tokens; the
official CLI uses temperature 0. Score 1.0 when every turn passes BFCL's state and response
checks. Not implemented here: BFCL's ``multi_turn_irrelevance`` path.
"""

from __future__ import annotations

import ast
import importlib.resources
import json
from typing import Any

from spade_async.envs.pool import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.suites.bfcl_env import CLASS_FILES, episode_source
from spade_async.eval.types import Item, Sample, Sampling

__all__ = ["BFCLMultiTurn", "parse_call", "parse_tool_calls"]

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
MAX_STEPS = 20
ADDED_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"
SYSTEM = (
    "You can call these functions:\n{tools}\n\nTo call functions, reply with one or more "
    '<tool_call>{{"name": "<function>", "arguments": {{...}}}}</tool_call> blocks; you will '
    "get their results. When the user's request is done, reply without any tool call."
)
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def _schema(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_TYPES.get(v, v) if k == "type" and isinstance(v, str) else _schema(v))
                for k, v in node.items()}  # fmt: skip
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def _short(description: str) -> str:
    """Drop BFCL's per-tool boilerplate ("This tool belongs to ... Tool description: ")."""
    return description.split("Tool description: ", 1)[-1].strip()


def parse_call(text: str) -> list:
    """``"cd(folder='x')"`` -> ``["cd", [], {"folder": "x"}]`` (literals only)."""
    call = ast.parse(text.strip(), mode="eval").body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    args = [ast.literal_eval(a) for a in call.args]
    return [call.func.id, args, {k.arg: ast.literal_eval(k.value) for k in call.keywords}]


def parse_tool_calls(reply: str) -> list[list]:
    """Every well-formed ``<tool_call>`` JSON in a reply, as ``[name, [], kwargs]``."""
    import re

    calls = []
    for body in re.findall(r"<tool_call>(.*?)</tool_call>", reply or "", re.S):
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if isinstance(name, str) and isinstance(args, dict):
                calls.append([name, [], args])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return calls


class BFCLMultiTurn(Suite):
    name = "bfcl_v4_multi_turn"
    sampling = Sampling(n=1, temperature=0.001, top_p=1.0, max_tokens=4096)
    majority = False
    multi_turn = True
    needs_pool = True

    def __init__(self) -> None:
        self._source: str | None = None

    def load(self, limit: int) -> list[Item]:
        try:
            root = importlib.resources.files("bfcl_eval") / "data"
            docs = {
                f: [json.loads(x) for x in (root / "multi_turn_func_doc" / f"{f}.json").read_text().splitlines() if x.strip()]
                for f in set(CLASS_FILES.values())
            }  # fmt: skip
            rows = {
                c: (
                    (root / f"BFCL_v4_multi_turn_{c}.json").read_text().splitlines(),
                    (root / "possible_answer" / f"BFCL_v4_multi_turn_{c}.json")
                    .read_text()
                    .splitlines(),
                )
                for c in CATEGORIES
            }
        except (ModuleNotFoundError, FileNotFoundError):
            raise SpadeError(
                "suite bfcl_v4_multi_turn needs the PyPI package bfcl-eval "
                "(pip install --no-deps bfcl-eval==2026.3.23; its pinned dependencies conflict, only its data is used)"
            ) from None
        items = []
        for i in range(max(len(q) for q, _ in rows.values())):
            for c in CATEGORIES:  # interleaved so a --limit spans categories
                if limit and len(items) >= limit:
                    return items
                questions, answers = rows[c]
                if i >= len(questions):
                    continue
                e, gt = json.loads(questions[i]), json.loads(answers[i])
                assert e["id"] == gt["id"], (e["id"], gt["id"])
                funcs = [d for cls in e["involved_classes"] for d in docs[CLASS_FILES[cls]]
                         if d["name"] not in e.get("excluded_function", [])]  # fmt: skip
                items.append(Item(
                    id=e["id"], messages=[], answer=json.dumps(gt["ground_truth"]),
                    meta={"questions": e["question"], "initial_config": e["initial_config"],
                          "involved_classes": e["involved_classes"], "functions": funcs,
                          "missed": e.get("missed_function", {}), "category": c,
                          "ground_truth": gt["ground_truth"]},
                ))  # fmt: skip
        return items

    def _tools(self, item: Item, turn: int) -> list[dict]:
        hidden = {n for t, names in item.meta["missed"].items() if int(t) > turn for n in names}
        return [
            {"type": "function", "function": {"name": d["name"], "description": _short(d["description"]),
                                              "parameters": _schema(d["parameters"])}}
            for d in item.meta["functions"] if d["name"] not in hidden
        ]  # fmt: skip

    async def play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        async with ctx.episode_slots:  # a worker is held for the whole episode (base.Context)
            return await self._play(item, k, sampling, ctx)

    async def _play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        if self._source is None:
            self._source = episode_source()
        meta = item.meta
        entry = {"initial_config": meta["initial_config"], "involved_classes": meta["involved_classes"],
                 "ground_truth": [[parse_call(c) for c in turn] for turn in meta["ground_truth"]],
                 "long_context": meta["category"] == "long_context"}  # fmt: skip
        messages: list[dict] = []
        extracted: list[list[str]] = []
        score, error = 0.0, None
        try:
            async with fresh_instance(ctx.pool, self._source, "bfcl", {"entry": entry}) as inst:
                for turn, question in enumerate(meta["questions"]):
                    tools = self._tools(item, turn)
                    system = SYSTEM.format(
                        tools="\n".join(
                            json.dumps(t["function"], separators=(",", ":")) for t in tools
                        )
                    )
                    if not messages:
                        messages.append({"role": "system", "content": system})
                    elif str(turn) in meta["missed"]:
                        messages[0] = {"role": "system", "content": system}
                    messages.extend(question or [{"role": "user", "content": ADDED_FUNCTIONS}])
                    turn_calls: list[str] = []
                    for _step in range(MAX_STEPS):
                        reply = await ctx.generate(messages, sampling, item=item)
                        messages.append({"role": "assistant", "content": reply})
                        calls = parse_tool_calls(reply)
                        if not calls:
                            break
                        obs, *_ = await ctx.pool.step(inst, json.dumps({"calls": calls}))
                        turn_calls += [json.dumps(c[2] | {"__name__": c[0]}) for c in calls]
                        for c, result in zip(calls, json.loads(obs), strict=True):
                            messages.append({"role": "tool", "name": c[0], "content": result})
                    extracted.append(turn_calls)
                    obs, reward, terminated, _, info = await ctx.pool.step(
                        inst, json.dumps({"end_turn": True})
                    )
                    if terminated:
                        score, error = reward, info.get("failure")
                        break
        except EnvError as exc:
            score, error = 0.0, f"sandbox: {exc}"
        return self._sample(item, k, messages, extracted, score, error, ctx)

    def _sample(self, item, k, messages, extracted, score, error, ctx) -> Sample:
        return Sample(
            id=item.id, sample=k, prompt=json.dumps(item.meta["questions"]),
            completion=next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), ""),
            answer=item.answer, extracted=json.dumps(extracted), score=score, error=error,
            transcript=messages, policy_version=ctx.policy_version,
        )  # fmt: skip
