"""Scripted engines for the evaluation tests: gold answers, or wrong ones, per suite."""

from __future__ import annotations

import json

from spade_async.eval.suites.bfcl import parse_call


def gold_reply(item, messages) -> str:
    """The reply a perfect model gives, in each suite's answer format."""
    if "mile_stone" in item.meta:  # ACEBench agent: replay the gold milestones, then finish
        return _ace_gold(item, messages)
    if "plain_functions" in item.meta:  # BFCL
        return _bfcl_gold(item, messages)
    if "canonical" in item.meta:
        return f"Here it is.\n```python\n{item.meta['canonical']}```"
    if "task" in item.meta:
        return f"Thinking... <answer>{item.answer}</answer>"
    return f"So the result is \\boxed{{{item.answer}}}."


def _tool_calls(calls) -> str:
    """QwenFCHandler's reply format: one ``<tool_call>\\n{json}\\n</tool_call>`` per call."""
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': kw})}\n</tool_call>" for n, kw in calls
    )


def _bfcl_gold(item, messages) -> str:
    meta = item.meta
    if meta["category"].startswith("multi_turn"):  # the turn's gold calls, then a plain reply
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        if messages[-1]["role"] == "tool" or not meta["ground_truth"][turn]:
            return "Done."
        calls = [_named(parse_call(c), item) for c in meta["ground_truth"][turn]]
        return _tool_calls((n, kw) for n, _, kw in calls)
    if "irrelevance" in meta["category"]:
        return "None of these functions fits the request."
    if "relevance" in meta["category"]:
        return _tool_calls([(meta["functions"][0]["name"], {})])
    as_text = meta["category"] in ("simple_java", "simple_javascript")  # typed as strings
    return _tool_calls(
        (name, _first(args, as_text))
        for call in meta["ground_truth"]
        for name, args in call.items()
    )


def _first(args: dict, as_text: bool) -> dict:
    """The first accepted value of every parameter ("" = may be omitted), nested dicts too."""
    out = {}
    for p, values in args.items():
        v = values[0] if values else ""
        if v == "":
            continue
        v = _first(v, False) if isinstance(v, dict) else v
        out[p] = json.dumps(v) if as_text and not isinstance(v, str) else v
    return out


def _named(call, item):
    """Positional gold arguments -> keyword arguments, by the function doc's order."""
    name, args, kwargs = call
    if args:
        docs = item.meta["functions"] + [d for m in item.meta.get("missed", {}).values() for d in m]
        doc = next(d for d in docs if d["name"] == name)
        params = list(doc["parameters"]["properties"])
        kwargs = dict(zip(params, args, strict=False)) | kwargs
    return name, [], kwargs


def _ace_gold(item, messages) -> str:
    history = messages[-1]["content"].split("The dialogue so far", 1)[-1]
    done = sum(1 for line in history.splitlines() if line.startswith("agent:"))
    stones = item.meta["mile_stone"]
    stones = stones[0] if stones and isinstance(stones[0], list) else stones
    if item.meta["category"] == "multi_turn":  # ask the simulated user once, then act
        if done == 0:
            return "Which account should I use?"
        done -= 1
    return stones[done] if done < len(stones) else "finish conversation"


def wrong_reply(item, messages) -> str:
    if "mile_stone" in item.meta:
        return "finish conversation"
    if "plain_functions" in item.meta:  # BFCL: a call where none is wanted, else none
        if "irrelevance" in item.meta["category"]:
            return _tool_calls([(item.meta["functions"][0]["name"], {})])
        return "I cannot help with that."
    if "canonical" in item.meta:
        return "```python\ndef nothing():\n    return None\n```"
    if "task" in item.meta:
        return "<answer>definitely wrong 9z</answer>"
    return "\\boxed{-987654321}"


class Scripted:
    def __init__(self, reply) -> None:
        self.reply, self.calls = reply, 0

    async def __call__(self, messages, sampling, *, item=None, tools=None) -> str:
        self.calls += 1
        return self.reply(item, messages)
