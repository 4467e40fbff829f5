"""ACEBench-Agent (English): ``agent_multi_step`` (20) and ``agent_multi_turn`` (30).

Data and scenario classes are the user's ACEBench checkout (``--data acebench_agent=DIR``,
see ``acebench_env``). Each episode runs in its own sandbox worker: the scenario classes
load there, and every call the model makes executes there; this process only parses calls
(``ast``, literals) and compares JSON end states (``acebench_check``).

The dialogue follows ACEBench's scenes. The agent sees one system prompt and one user
message holding the API list and the dialogue so far as ``user:``/``agent:``/``execution:``
lines, and replies with calls ``[ApiName(key='value')]`` (``<tool_call>`` JSON is accepted
too) or text; ``<think>`` blocks are dropped. multi_step: the question is fixed and every
agent reply goes to execution (a reply that is not calls gets "do not ask, solve it"); the
history also lists the agent's own calls (ACEBench's step scene leaves them out, a quirk not
copied). multi_turn: a user simulator (any OpenAI-compatible chat endpoint, ``--user-sim
URL --user-sim-model NAME``; ACEBench uses gpt-4o at temperature 0.001, 1,000 tokens) plays
the user from the item's instruction; replies that parse as calls go to execution, others
to the user. Without a simulator the multi_turn half is skipped, with one note, and the
metric is named ``agent_multi_step_only``. A dialogue ends at 40 messages or when a message
after the second says "finish conversation".

Metrics: ``multi_step_end_to_end``, ``multi_turn_end_to_end`` (ACEBench's end-state check),
their ``_process`` (milestone) accuracies, and ``agent`` = the mean of the two end-to-end
accuracies (ACEBench's Agent score). Reference sampling (spade eval_offline tool_use.yaml):
temperature 0.7, top_p 1.0, 16,384 tokens per reply (thinking on). Not covered: the Chinese
data (``data_zh``), and ACEBench's non-agent categories (normal, special).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spade_async.envs.pool import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.suites import acebench_prompts as P
from spade_async.eval.suites.acebench_check import end_to_end, parse_calls, process_accuracy
from spade_async.eval.suites.acebench_env import (
    ACE_FORMAT,
    CATEGORIES,
    Checkout,
    episode_source,
    find_checkout,
)  # fmt: skip
from spade_async.eval.suites.acebench_user import SimulatorError, UserSimulator
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.types import Item, Sample, Sampling
from spade_async.generation.chat import strip_think

__all__ = ["ACEBenchAgent", "SKIPPED"]

MAX_DIALOG = 40
FINISH = "finish conversation"
SKIPPED = (
    "multi_turn skipped: no user simulator (pass --user-sim URL [--user-sim-model NAME]); "
    "the agent metric covers multi_step only"
)
OPTIONS = {"user_url": "simulator endpoint", "user_model": "simulator model name",
           "user_key_env": "environment variable holding the simulator's API key"}  # fmt: skip


@dataclass
class _Dialog:
    system: str
    history: str = ""
    transcript: list[dict] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)  # agent messages sent to execution
    last_reply: str = ""

    def add(self, role: str, label: str, text: str) -> None:
        self.history += f"{label}:{text}\n"
        self.transcript.append({"role": role, "content": text})


class ACEBenchAgent(Suite):
    name = "acebench_agent"
    sampling = Sampling(n=1, temperature=0.7, top_p=1.0, max_tokens=16384)
    majority = False
    multi_turn = True
    needs_pool = True

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.options: dict[str, str] = {}
        self.notes: list[str] = []
        self._checkout: Checkout | None = None
        self._source: str | None = None

    def configure(self, options: dict[str, str]) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            known = ", ".join(f"{self.name}.{k} ({v})" for k, v in OPTIONS.items())
            raise SpadeError(f"unknown option {self.name}.{unknown[0]}; known: {known}")
        self.options = dict(options)

    def simulator(self) -> UserSimulator | None:
        url = self.options.get("user_url")
        if not url:
            return None
        env = self.options.get("user_key_env")
        if env and env not in os.environ:
            raise SpadeError(f"{self.name}.user_key_env names {env}, which is not set")
        return UserSimulator(url=url, model=self.options.get("user_model") or "gpt-4o",
                             key=os.environ.get(env) if env else None)  # fmt: skip

    def _rows(self, co: Checkout, category: str) -> list[Item]:
        def lines(path: Path) -> list[dict]:
            out = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        raise SpadeError(
                            f"{path}:{n}: not a JSON line; expected {ACE_FORMAT}"
                        ) from None
            return out

        data = co.data / f"data_agent_{category}.json"
        rows, answers = lines(data), lines(co.data / "possible_answer" / data.name)
        if len(rows) != len(answers):
            raise SpadeError(f"{data}: {len(rows)} items but {len(answers)} possible answers")
        items = []
        for n, (row, gold) in enumerate(zip(rows, answers, strict=True), 1):
            try:
                meta = {"category": category, "question": str(row["question"]),
                        "functions": row["function"], "initial_config": dict(row["initial_config"]),
                        "involved_classes": list(row["involved_classes"]),
                        "ground_truth": list(gold["ground_truth"]),
                        "mile_stone": list(gold.get("mile_stone") or [])}  # fmt: skip
                same = row["id"] == gold["id"]
            except (KeyError, TypeError, ValueError):
                raise SpadeError(
                    f"{data}:{n}: needs id, question, function, initial_config, involved_classes "
                    f"(and its possible answer id, ground_truth); expected {ACE_FORMAT}"
                ) from None
            if not same:
                raise SpadeError(f"{data}:{n}: id {row['id']} but possible answer {gold['id']}")
            unknown = [c for c in meta["involved_classes"] if c not in co.modules[category]]
            if unknown:
                raise SpadeError(f"{data}:{n}: class {unknown[0]} is not in {category}'s class map")
            items.append(Item(id=str(row["id"]), messages=[], meta=meta,
                              answer=json.dumps(meta["ground_truth"])))  # fmt: skip
        return items

    def load(self, limit: int) -> list[Item]:
        co = self._checkout = find_checkout(self.path)
        rows = {c: self._rows(co, c) for c in CATEGORIES}
        self.notes = []
        if self.simulator() is None:
            rows["multi_turn"] = []
            self.notes = [SKIPPED]
        items = []
        for i in range(max(len(r) for r in rows.values())):
            for c in CATEGORIES:  # interleaved so a --limit spans both halves
                if i < len(rows[c]) and not (limit and len(items) >= limit):
                    items.append(rows[c][i])
        return items

    async def play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        async with ctx.episode_slots:  # a worker is held for the whole dialogue (base.Context)
            return await self._play(item, k, sampling, ctx)

    async def _play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        co = self._checkout or find_checkout(self.path)
        self._checkout = co
        if self._source is None:
            self._source = episode_source(co)
        meta, cat = item.meta, item.meta["category"]
        involved = meta["involved_classes"]
        entry = {"modules": {c: co.modules[cat][c] for c in involved}, "involved_classes": involved,
                 "initial_config": meta["initial_config"],
                 "saved": {c: list(co.saved.get(c, [])) for c in involved}}  # fmt: skip
        system = (
            P.STEP_SYSTEM
            if cat == "multi_step"
            else P.TURN_SYSTEM
            + "".join(co.prompts[c] for c in ("Travel", "BaseApi") if c in involved)
        )
        dialog = _Dialog(system, transcript=[{"role": "system", "content": system}])
        score, error = 0.0, None
        try:
            async with fresh_instance(ctx.pool, self._source, "ace", {"entry": entry},
                                      env_class="AceEpisodeEnv") as inst:  # fmt: skip
                if cat == "multi_step":
                    await self._multi_step(item, sampling, ctx, inst, dialog)
                else:
                    await self._multi_turn(item, sampling, ctx, inst, dialog)
                obs, *_ = await ctx.pool.step(inst, json.dumps({"final": True}))
            try:
                error = end_to_end(json.loads(obs), meta["ground_truth"])
            except ValueError:
                error = "the end state is not JSON"
            score = 1.0 if error is None else 0.0
        except EnvError as exc:
            error = f"sandbox: {exc}"
        except SimulatorError as exc:
            error = str(exc)
        return self._sample(item, k, dialog, score, error, ctx)

    async def _agent(self, item, sampling, ctx, dialog: _Dialog, user: str) -> str:
        functions = json.dumps(item.meta["functions"], ensure_ascii=False)
        messages = [{"role": "system", "content": dialog.system},
                    {"role": "user", "content": user.format(functions=functions, history=dialog.history)}]  # fmt: skip
        reply = strip_think(await ctx.generate(messages, sampling, item=item))
        dialog.last_reply = reply
        dialog.add("assistant", "agent", reply)
        return reply

    async def _execute(self, ctx, inst, dialog: _Dialog, calls: list | None, label: str) -> str:
        dialog.steps.append(dialog.last_reply)
        if calls is None:
            result = P.NO_CALLS
        else:
            obs, *_ = await ctx.pool.step(inst, json.dumps({"calls": calls}))
            try:
                result = str(json.loads(obs))
            except ValueError:
                result = obs
        dialog.add("tool", label, result)
        return result

    async def _multi_step(self, item, sampling, ctx, inst, dialog: _Dialog) -> None:
        dialog.add("user", "user", item.meta["question"])
        last = "user"
        for index in range(MAX_DIALOG):
            if last != "agent":
                text, last = await self._agent(item, sampling, ctx, dialog, P.STEP_USER), "agent"
            else:
                calls = parse_calls(dialog.last_reply)
                text = await self._execute(ctx, inst, dialog, calls, "execution result")
                last = "execution"
            if index > 1 and FINISH in text:
                return

    async def _multi_turn(self, item, sampling, ctx, inst, dialog: _Dialog) -> None:
        sim = self.simulator()
        if sim is None:
            raise SimulatorError(SKIPPED)
        involved = item.meta["involved_classes"]
        chat = [{"role": "system", "content": P.simulator_prompt(item.meta["question"], involved)},
                {"role": "user", "content": P.SIM_OPENING}]  # fmt: skip
        async with httpx.AsyncClient(timeout=120.0) as client:
            first = await sim.reply(client, chat)
            chat.append({"role": "assistant", "content": first})
            dialog.add("user", "user", first)
            to, calls = "agent", None
            for index in range(MAX_DIALOG):
                if to == "user":
                    said = dialog.last_reply.removeprefix("agent:").removeprefix("user:")
                    chat.append({"role": "user", "content": said})  # ACEBench drops the prefix
                    text = await sim.reply(client, chat)
                    chat.append({"role": "assistant", "content": text})
                    dialog.add("user", "user", text)
                    to = "agent"
                elif to == "agent":
                    text = await self._agent(item, sampling, ctx, dialog, P.TURN_USER)
                    calls = parse_calls(text)
                    to = "execution" if calls else "user"
                else:
                    text = await self._execute(ctx, inst, dialog, calls, "execution")
                    to = "agent"
                if index > 1 and FINISH in text:
                    return

    def _sample(self, item: Item, k: int, dialog: _Dialog, score: float, error, ctx) -> Sample:
        process = 1.0 if score == 1.0 else process_accuracy(dialog.steps, item.meta["mile_stone"])
        extracted = {"category": item.meta["category"], "process": process, "calls": dialog.steps}
        return Sample(
            id=item.id, sample=k, prompt=item.meta["question"], completion=dialog.last_reply,
            answer=item.answer, extracted=json.dumps(extracted, ensure_ascii=False), score=score,
            error=error, transcript=dialog.transcript, policy_version=ctx.policy_version,
        )  # fmt: skip

    def metrics(self, samples: list[Sample], k: int) -> dict[str, float]:
        by: dict[str, list[tuple[float, float]]] = {c: [] for c in CATEGORIES}
        for s in samples:
            try:
                info: Any = json.loads(s.extracted or "{}")
                cat, process = info["category"], float(info["process"])
            except (ValueError, KeyError, TypeError):
                cat, process = ("multi_turn" if "multi_turn" in s.id else "multi_step"), 0.0
            by.setdefault(cat, []).append((s.score, process))
        out: dict[str, float] = {}
        for cat in CATEGORIES:
            if by[cat]:
                out[f"{cat}_end_to_end"] = sum(x for x, _ in by[cat]) / len(by[cat])
                out[f"{cat}_process"] = sum(p for _, p in by[cat]) / len(by[cat])
        if by["multi_step"] and by["multi_turn"]:
            out["agent"] = (out["multi_step_end_to_end"] + out["multi_turn_end_to_end"]) / 2
        elif by["multi_step"]:
            out["agent_multi_step_only"] = out["multi_step_end_to_end"]
        return out
