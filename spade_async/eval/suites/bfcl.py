"""BFCL-v4 from ``bfcl-eval`` (data, checkers and API classes ship in the PyPI package).

``bfcl_v4``: the reference's ``--test-category non_live,live,multi_turn`` (17 categories,
4,430 entries), scored as BFCL scores them; ``overall`` is BFCL's "Overall Acc", the paper's
BFCL-v4 column (``table_mapping.py``: ``bfcl_overall_acc``): 10 non-live + 10 live + 10
irrelevance + 30 multi-turn + 40 agentic out of 100, where agentic (memory, web_search),
which the reference does not run, counts 0 as BFCL counts a category it did not evaluate.
``bfcl_v4_multi_turn``: the four multi-turn categories only (``multi_turn`` is the
reference's ``bfcl_multi_turn_acc``).

How the model meets it (``bfcl_lib``): BFCL's function docs as ``tools`` through the model's
own chat template (BFCL's QwenFCHandler formatting where the template has no tool support),
``<tool_call>`` JSON replies, reasoning before the last ``</think>`` dropped before calls are
parsed, at most 20 steps per turn (a 21st fails the entry as BFCL's force-quit does).
Single-turn replies are judged by bfcl-eval's ``ast_checker`` / relevance rule in the
checker processes; multi-turn episodes run in a sandbox pool whose workers see bfcl-eval
(``bfcl_env``): model calls are executed there only. Settings: the reference's offline
CLI uses temperature 0 (here 0.001, its in-loop value: greedy in effect) and up to 4,096
tokens per step. Metrics: ``overall``, the sections, every category's accuracy, avg@k.
"""

from __future__ import annotations

import ast
import json

from spade_async.envs.pool import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.checker import CheckTimeout
from spade_async.eval.suites import bfcl_lib as lib
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.suites.bfcl_env import PACKAGES, SOURCE
from spade_async.eval.types import Item, Sample, Sampling

__all__ = ["BFCL", "parse_call"]


def parse_call(text: str) -> list:
    """``"cd(folder='x')"`` -> ``["cd", [], {"folder": "x"}]`` (literals only; test helper)."""
    call = ast.parse(text.strip(), mode="eval").body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    args = [ast.literal_eval(a) for a in call.args]
    return [call.func.id, args, {k.arg: ast.literal_eval(k.value) for k in call.keywords}]


class BFCL(Suite):
    sampling = Sampling(n=1, temperature=0.001, top_p=1.0, max_tokens=4096)
    majority = False
    multi_turn = True  # --responses: multi-turn transcripts cannot be re-scored
    episode_packages = PACKAGES  # runner: a pool of its own whose workers import bfcl-eval

    def __init__(self, name: str, categories: tuple[str, ...]) -> None:
        self.name, self.categories = name, categories
        self.sizes: dict[str, int] = {}
        self.notes: list[str] = []

    def load(self, limit: int) -> list[Item]:
        try:
            data = {c: lib.load_category(c) for c in self.categories}
        except ModuleNotFoundError as exc:
            raise SpadeError(
                f"suite {self.name} needs the PyPI package bfcl-eval (pip install --no-deps "
                f"bfcl-eval==2026.3.23; its pinned dependencies conflict): {exc}"
            ) from None
        self.sizes = {c: len(v) for c, v in data.items()}
        items: list[Item] = []
        for i in range(max(self.sizes.values())):
            for c in self.categories:  # interleaved so a --limit spans categories
                if limit and len(items) >= limit:
                    return items
                if i < len(data[c]):
                    items.append(self._item(c, data[c][i]))
        return items

    @staticmethod
    def _item(category: str, e: dict) -> Item:
        meta = {"category": category, "functions": e.get("function", []),
                "plain_functions": e.get("plain_function", []), "question": e["question"]}  # fmt: skip
        if "ground_truth" in e:
            meta["ground_truth"] = e["ground_truth"]
        if category in lib.MULTI_TURN:
            meta |= {"initial_config": e.get("initial_config", {}),
                     "involved_classes": e["involved_classes"],
                     "missed": e.get("missed_function", {})}  # fmt: skip
        return Item(id=e["id"], messages=[], answer=json.dumps(e.get("ground_truth", [])),
                    meta=meta)  # fmt: skip

    def metrics(self, samples: list[Sample], k: int) -> dict[str, float]:
        by_cat: dict[str, list[float]] = {}
        ids: dict[str, set[str]] = {}
        for s in samples:
            by_cat.setdefault(_category(s.id), []).append(s.score)
            ids.setdefault(_category(s.id), set()).add(s.id)
        acc = {c: sum(v) / len(v) for c, v in by_cat.items()}
        count = {c: len(v) for c, v in ids.items()}
        agg = lib.aggregate(acc, count, self.sizes)
        out: dict[str, float] = {}
        if set(self.categories) >= set(lib.NON_LIVE + lib.LIVE):
            out |= {m: agg[m] for m in ("overall", "non_live", "live", "irrelevance")}
        out["multi_turn"] = agg["multi_turn"]
        out |= {c: acc[c] for c in self.categories if c in acc}  # those evaluated
        return out | super().metrics(samples, k)

    async def play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        if item.meta["category"] not in lib.MULTI_TURN:
            return await self._single(item, k, sampling, ctx)
        pool, slots = ctx.episode_pools[self.name]
        async with slots:  # a worker is held for the whole episode
            return await self._multi(item, k, sampling, ctx, pool)

    async def _single(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        meta = item.meta
        messages = [dict(m) for m in meta["question"][0]]
        reply = await ctx.generate(messages, sampling, item=item, tools=meta["functions"])
        try:
            v = await ctx.checker.call(lib.single_turn_verdict, meta["category"],
                                       meta["plain_functions"], meta.get("ground_truth"), reply)  # fmt: skip
        except CheckTimeout as exc:  # the checker on a pathological reply: a wrong answer
            v = {"valid": False, "error_type": f"checker: {exc}", "decoded": None}
        return Sample(
            id=item.id, sample=k, prompt=json.dumps(meta["question"]), completion=reply,
            answer=item.answer, extracted=v["decoded"], score=1.0 if v["valid"] else 0.0,
            error=v["error_type"], policy_version=ctx.policy_version,
        )  # fmt: skip

    async def _multi(self, item, k, sampling, ctx, pool) -> Sample:
        meta = item.meta
        entry = {"id": item.id, "initial_config": meta["initial_config"],
                 "involved_classes": meta["involved_classes"],
                 "ground_truth": meta["ground_truth"]}  # fmt: skip
        history: list[dict] = []
        turns: list[list[str]] = []  # BFCL's model_result: every step's reply, per turn
        score, error = 0.0, None
        try:
            async with fresh_instance(pool, SOURCE, "bfcl", {"entry": entry}) as inst:
                forced = False
                for turn, question in enumerate(meta["question"]):
                    if str(turn) in meta["missed"]:  # held-out functions, as BFCL's prompting path
                        docs = meta["missed"][str(turn)]
                        question = [
                            {"role": "user", "content": lib.ADDITIONAL.format(functions=docs)}
                        ]
                    history.extend(dict(m) for m in question)
                    replies: list[str] = []
                    steps = 0
                    while True:
                        raw = await ctx.generate(
                            history, sampling, item=item, tools=meta["functions"]
                        )
                        text, reasoning = lib.split_reasoning(raw)
                        replies.append(text)
                        try:
                            decoded = lib.decode_execute(text)
                        except Exception:  # noqa: BLE001 - BFCL: a reply it cannot decode ends the turn
                            decoded = []
                        msg = {"role": "assistant", "content": text, "reasoning_content": reasoning}
                        if decoded:  # as QwenFCHandler keeps it: the calls, no text
                            msg |= {"content": "", "tool_calls": lib.extract_tool_calls(text)}
                        history.append(msg)
                        if lib.is_empty_execute(decoded):
                            break
                        obs, *_ = await pool.step(inst, json.dumps({"execute": decoded}))
                        for call, result in zip(decoded, json.loads(obs), strict=True):
                            history.append({"role": "tool", "name": call, "content": result})
                        steps += 1
                        if steps > lib.MAX_STEPS:
                            forced = True
                            break
                    turns.append(replies)
                    if forced:
                        break
                if len(turns) != len(meta["ground_truth"]):
                    error = "multi_turn:force_terminated"
                else:
                    _, score, _, _, info = await pool.step(
                        inst, json.dumps({"check": [_decoded_steps(t) for t in turns]})
                    )
                    error = info.get("failure")
        except EnvError as exc:
            score, error = 0.0, f"sandbox: {exc}"
        return Sample(
            id=item.id, sample=k, prompt=json.dumps(meta["question"]),
            completion=next((m["content"] for m in reversed(history) if m["role"] == "assistant"), ""),
            answer=item.answer, extracted=json.dumps(turns), score=float(score), error=error,
            transcript=history, policy_version=ctx.policy_version,
        )  # fmt: skip


def _decoded_steps(replies: list[str]) -> list[list[str]]:
    """One turn's replies as eval_runner decodes them: undecodable or empty ones skipped."""
    out = []
    for text in replies:
        try:
            decoded = lib.decode_execute(text)
        except Exception:  # noqa: BLE001
            continue
        if not lib.is_empty_execute(decoded):
            out.append(decoded)
    return out


def _category(entry_id: str) -> str:
    """``live_simple_0-0-0`` -> ``live_simple``; ``simple_python_12`` -> ``simple_python``."""
    return entry_id.rsplit("_", 1)[0]
