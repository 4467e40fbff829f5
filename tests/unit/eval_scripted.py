"""Scripted engines for the evaluation tests: gold answers, or wrong ones, per suite."""

from __future__ import annotations

import json

from spade_async.eval.suites.bfcl import parse_call


def gold_reply(item, messages) -> str:
    """The reply a perfect model gives, in each suite's answer format."""
    if "mile_stone" in item.meta:  # ACEBench agent: replay the gold milestones, then finish
        return _ace_gold(item, messages)
    if "ground_truth" in item.meta:  # BFCL: the turn's gold calls, then a plain reply
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        if messages[-1]["role"] == "tool" or not item.meta["ground_truth"][turn]:
            return "Done."
        calls = [parse_call(c) for c in item.meta["ground_truth"][turn]]
        return "".join(
            f"<tool_call>{json.dumps({'name': n, 'arguments': kw})}</tool_call>"
            for n, args, kw in (_named(c, item) for c in calls)
        )
    if "canonical" in item.meta:
        return f"Here it is.\n```python\n{item.meta['canonical']}```"
    if "task" in item.meta:
        return f"Thinking... <answer>{item.answer}</answer>"
    return f"So the result is \\boxed{{{item.answer}}}."


def _named(call, item):
    """Positional gold arguments -> keyword arguments, by the function doc's order."""
    name, args, kwargs = call
    if args:
        doc = next(d for d in item.meta["functions"] if d["name"] == name)
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
    if "ground_truth" in item.meta:
        return "I cannot help with that."
    if "canonical" in item.meta:
        return "```python\ndef nothing():\n    return None\n```"
    if "task" in item.meta:
        return "<answer>definitely wrong 9z</answer>"
    return "\\boxed{-987654321}"


class Scripted:
    def __init__(self, reply) -> None:
        self.reply, self.calls = reply, 0

    async def __call__(self, messages, sampling, *, item=None) -> str:
        self.calls += 1
        return self.reply(item, messages)
