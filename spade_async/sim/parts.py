"""Simulated tokenizer, environment pool and trainer ranks, with costs from ``costs.Costs``.

- ``SimTokenizer``: a chat template the project's ``Conversation`` accepts (append-only),
  about four characters a token, and the first token of a prompt tagging its role (agent,
  hint, designer) for the engines' length draws.
- ``SimPool``: the ``EnvPool`` calls the roles make (open, reset, step, solution, tools,
  close) on ``envs.max_workers`` workers; each environment instance draws its episode length
  (turns, long-tailed) at reset and pays ``env_step_s`` per step; the designer's validation
  (``validate_source``) takes ``validate_s`` and is valid with ``Lengths.valid_p``.
- ``SimTrainer``: ``train_step`` takes ``train_fixed + offload + tokens x train_per_token +
  sum(len^2)/2 x train_per_ctx_token``; ``save`` takes ``checkpoint_s``; ``push_weights`` pauses the engines (retract flushes
  their KV cache) for ``push_s`` and sets their version; colocated, a train step holds the
  engines (the GPUs are the trainer's meanwhile).
"""

from __future__ import annotations

import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np

from spade_async.envs.validate import Verdict
from spade_async.generation.chat import encode_ids
from spade_async.roles.agent import GAMES_SYSTEM, TOOL_SYSTEM
from spade_async.roles.prompts import HINT_SYSTEM, TOOL_USE_HINT_SYSTEM
from spade_async.sim.costs import Costs, lognormal
from spade_async.sim.engine import (
    GAMES_REPLY,
    ROLE_AGENT,
    ROLE_DESIGNER,
    ROLE_HINT,
    SIM_CPU,
    SOLUTION,
    TOOL_REPLY,
    SimEngine,
)
from spade_async.trainer.rpc import WeightsPushed

__all__ = ["SimTokenizer", "RealTokenizerInPath", "SimPool", "SimTrainer", "SimProc", "FILLER"]

CHARS_PER_TOKEN = 4
_AGENT = (GAMES_SYSTEM[:40], TOOL_SYSTEM[:40])
_HINT = (HINT_SYSTEM[:40], TOOL_USE_HINT_SYSTEM[:40])


class SimTokenizer:
    name_or_path = "sim"
    chat_template = "sim"
    all_special_ids = [2]

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=True,
                            **kw) -> str:  # fmt: skip
        text = "".join(f"<|{m['role']}|>{m.get('content', '')}<|end|>\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = False):
        n = max(1, len(text) // CHARS_PER_TOKEN)
        ids = [5] * n
        if text.startswith("<|system|>"):  # a prompt's first token names its role
            body = text[10:80]
            ids[0] = (ROLE_AGENT if body.startswith(_AGENT) else ROLE_HINT
                      if body.startswith(_HINT) else ROLE_DESIGNER)  # fmt: skip
        return SimpleNamespace(input_ids=ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "" if skip_special_tokens else "<|end|>"


def _role_tag(text: str) -> int | None:
    """The role tag for a rendered prompt (its system turn's first words), else None."""
    head = text[:240]
    if not any(m in head for m in ("system", "<|system|>")):
        return None
    if any(a in head for a in _AGENT):
        return ROLE_AGENT
    return ROLE_HINT if any(h in head for h in _HINT) else ROLE_DESIGNER


_PLUMBING = frozenset({"encode_ids", "_encode", "render_text", "render_prompt", "_render"})


def _caller() -> str:
    """The controller's function that asked (past ``_count``, the hook that called and
    chat.py's own helpers)."""
    f = sys._getframe(3)
    for _ in range(4):
        if f.f_code.co_name not in _PLUMBING:
            break
        f = f.f_back
    return f.f_code.co_name


class RealTokenizerInPath(SimTokenizer):
    """A real Hugging Face tokenizer in the controller's path: its chat template renders and
    it encodes every text the loop hands it (the CPU the controller pays), while the ids the
    engines see keep ``SimTokenizer``'s count (about four characters a token, the role tag
    first) so that the simulated workload is the same with or without it; making those ids is
    the simulator's CPU (``SIM_CPU``). ``cpu``: "encode|render|decode < caller" -> [calls,
    CPU seconds], where the controller's tokenizer CPU goes; ``last``: the latest one made
    (``bench/simulate.py`` reads its ``cpu`` after a run)."""

    last: RealTokenizerInPath | None = None

    def __init__(self, real) -> None:
        RealTokenizerInPath.last = self
        self.real = real
        self.name_or_path = f"{getattr(real, 'name_or_path', 'hf')} (in the path)"
        self.chat_template = real.chat_template
        self.cpu: dict[str, list] = {}

    def _count(self, kind: str, c0: float) -> None:
        entry = self.cpu.setdefault(f"{kind} < {_caller()}", [0, 0.0])
        entry[0] += 1
        entry[1] += time.process_time() - c0

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=True,
                            **kw) -> str:  # fmt: skip
        c0 = time.process_time()
        text = self.real.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kw)  # fmt: skip
        self._count("render", c0)
        return text

    def __call__(self, text: str, add_special_tokens: bool = False):
        c0 = time.process_time()
        if add_special_tokens:
            self.real(text, add_special_tokens=True)  # the real encoding's CPU
        else:  # as the controller encodes on a real tokenizer (generation/chat.py)
            encode_ids(self.real, text)
        self._count("encode", c0)
        c0 = time.process_time()
        n = max(1, len(text) // CHARS_PER_TOKEN)
        ids = [5] * n
        tag = _role_tag(text)
        if tag is not None:
            ids[0] = tag
        SIM_CPU[0] += time.process_time() - c0
        return SimpleNamespace(input_ids=ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        c0 = time.process_time()
        text = self.real.decode(list(ids), skip_special_tokens=skip_special_tokens)
        self._count("decode", c0)
        return text


# what observations and prompts read like (a real tokenizer's cost depends on the text)
FILLER = ("The board is a grid of cells; row 3 column 4 holds a blue piece and the cell to "
          "its left is empty. Your last move was legal. ")  # fmt: skip


def filler(chars: int) -> str:
    return (FILLER * (chars // len(FILLER) + 1))[:chars]


@dataclass
class _Inst:
    env_id: str
    turns: int = 0
    limit: int = 1
    win: bool = False
    scripted: str = ""  # an audit's play: "solution" wins, "garbage" loses


@dataclass
class SimPool:
    costs: Costs
    max_workers: int
    rng: np.random.Generator
    tool_use: bool = False
    config: SimpleNamespace = field(init=False)
    isolation: str = "sim"

    def __post_init__(self) -> None:
        self.config = SimpleNamespace(max_workers=self.max_workers)
        self._workers = anyio.CapacityLimiter(max(1, self.max_workers))
        self.steps = 0
        self.obs = filler(self.costs.lengths.obs_tokens * CHARS_PER_TOKEN)
        first = self.costs.lengths.prompt_tokens - len(GAMES_SYSTEM) // CHARS_PER_TOKEN
        self.first = filler(max(1, first) * CHARS_PER_TOKEN)

    async def _work(self, seconds: float) -> None:
        async with self._workers:
            await anyio.sleep(seconds)

    async def validate_source(self, source: str) -> Verdict:
        await self._work(self.costs.validate_s)
        ok = bool(self.rng.random() < self.costs.lengths.valid_p)
        return Verdict(valid=ok, stage="ok" if ok else "dummy_steps", reason="simulated",
                       env_class="SimEnv", multi_turn=True, feasibility="unverified")  # fmt: skip

    async def reserve(self, *env_ids: str) -> None:
        return None

    async def release(self, env_id: str) -> None:
        return None

    async def open(self, source: str, env_id: str | None = None, **kw) -> _Inst:
        await self._work(self.costs.env_open_s)
        return _Inst(env_id=env_id or "sim")

    async def reset(self, inst: _Inst, seed: int | None = None) -> tuple[str, dict]:
        ln = self.costs.lengths
        inst.turns, inst.scripted = 0, ""
        # an episode's length is its seed's: the audit's solution instance (another env_id) agrees
        rng = self.rng if seed is None else np.random.default_rng(seed % 2**32)
        inst.limit, _ = lognormal(rng, ln.agent_turns_median, ln.agent_turns_sigma, 10_000)
        # an environment's difficulty is its own: plays of one environment share a win rate
        p = (zlib.crc32(inst.env_id.encode()) % 1000) / 1000 * 2 * ln.win_p
        inst.win = bool(self.rng.random() < min(1.0, p))
        return self.first, {}

    async def step(self, inst: _Inst, action: str) -> tuple[str, float, bool, bool, dict]:
        await self._work(self.costs.env_step_s)
        self.steps += 1
        inst.turns += 1
        if SOLUTION in action:
            inst.scripted = "solution"
        elif action not in (GAMES_REPLY, TOOL_REPLY) and not inst.scripted:
            inst.scripted = "garbage"  # audits: an honest environment never loses to it
        done = inst.turns >= inst.limit
        win = inst.win if not inst.scripted else inst.scripted == "solution"
        return self.obs, (1.0 if win else -1.0) if done else 0.0, done, False, {}

    async def solution(self, inst: _Inst) -> list[str]:
        return [SOLUTION] * inst.limit

    async def get_tools(self, inst: _Inst) -> list[dict]:
        return [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]

    async def close(self, inst: _Inst) -> None:
        return None

    def stats(self) -> dict:
        return {"steps": self.steps}


class SimProc:
    proc = None

    def alive(self):
        return None

    def stop(self, timeout: float = 0.0) -> None:
        return None


class SimTrainer:
    def __init__(self, costs: Costs, engines: list[SimEngine]) -> None:
        self.c, self.engines = costs, engines
        self.version = 0
        self.steps = 0
        self.busy_s = 0.0

    async def train_step(self, batch) -> dict[str, float]:
        lens = [len(s.token_ids) for s in batch.samples]
        tokens = sum(lens)
        c = self.c
        seconds = (
            c.train_fixed_s
            + c.offload_s
            + tokens * c.train_per_token_s
            + sum(n * n for n in lens) / 2 * c.train_per_ctx_token_s
        )
        if c.colocated:  # the GPUs are the trainer's for the step
            for e in self.engines:
                e.hold()
        try:
            await anyio.sleep(seconds)
        finally:
            if c.colocated:
                for e in self.engines:
                    e.release()
        self.busy_s += seconds
        self.version += 1
        self.steps += 1
        return {"samples": float(len(lens)), "tokens": float(tokens), "loss": 0.0,
                "step_s": seconds}  # fmt: skip

    async def push_weights(self, engines=None, *, pause_mode: str = "", **kw) -> WeightsPushed:
        for e in self.engines:
            e.hold()
        try:
            await anyio.sleep(self.c.push_s)
        finally:
            for e in self.engines:
                e.version = self.version
                e.release(flush=pause_mode == "retract")
        self.busy_s += self.c.push_s
        return WeightsPushed(
            version=self.version,
            engines={e.url: str(self.version) for e in self.engines},
            seconds=self.c.push_s,
            paused_s=self.c.push_s if pause_mode else 0.0,
        )

    async def save(self, directory: str, **kw):
        """A checkpoint write (``Costs.checkpoint_s``, ``sim/extras.py``); the directory is
        made, as DCP does. Colocated, the engines wait (the GPUs hold the trainer's state)."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        if self.c.colocated:
            for e in self.engines:
                e.hold()
        try:
            await anyio.sleep(self.c.checkpoint_s)
        finally:
            if self.c.colocated:
                for e in self.engines:
                    e.release()
        self.busy_s += self.c.checkpoint_s
