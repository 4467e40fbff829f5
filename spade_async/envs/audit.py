"""Scripted plays inside training: the environment's own ``solution()`` or garbage, played
through the same pool as the agent's episodes and shaped like one.

A scripted play is what ``roles/agent.play_episode`` does to an environment with the engine
taken out: ``open`` (same pool, same ``env_id``, so the same worker as its siblings), one
``reset(seed)``, ``get_tools()`` on a tool-use environment only, one ``step()`` per turn up
to the agent's ``max_turns``, ``close()``. Its turns are paced by a real sibling play of the
same group (``Pace``): step k goes out once the sibling has sent its own step k (its
generation time is the scripted play's), and past the sibling's last step at the
sibling's mean turn gap. Nothing in the messages, their order, their timing or the
number of instances tells it from the agent's plays.

The solution's actions come from a separate instance in a worker of its own
(``solution_for``: open, reset(seed), solution(), close, as the hint writer's instance),
so the worker that plays never sees ``solution()`` run for the seed it is then played on.

``loop/audits.py`` decides which slots are scripted and what a verdict means.
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass, field

import anyio
import msgspec

from spade_async.config import Doc
from spade_async.envs.pool import EnvError, EnvPool

__all__ = ["AuditConfig", "Pace", "ScriptedResult", "scripted_play", "solution_for", "ENV_FAULTS"]

# EnvError kinds that are the environment's doing (an audit that meets one quarantines);
# "busy" and "boot" are the pool's capacity and the machine's, never the environment's
ENV_FAULTS = frozenset(
    {"timeout", "crash", "lost", "memory", "output_too_large", "protocol", "exception", "structure"}
)


class AuditConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    share: Doc(
        float,
        "share of each play group's no-hint slots that are scripted audit plays (solution() "
        "or garbage; never trained, no engine tokens); 0 = no audits. Default measured in "
        "docs/audits.md (bench/audit_cost.py)",
    ) = 0.0625
    min_per_group: Doc(
        int,
        "scripted plays in every group of 2 or more slots whatever the share (an "
        "environment's first 2 groups of 4 slots or more have at least 2: one of each kind)",
    ) = 1
    garbage_replies: Doc(
        int, "policy replies remembered per environment as garbage for the others' audits"
    ) = 64
    default_gap_s: Doc(
        float, "turn gap of a scripted play before any real play was timed (seconds)"
    ) = 1.0


@dataclass
class Pace:
    """The turn times of one real play, for the scripted play paired with it."""

    # the event loop's clock (anyio.current_time: monotonic, or the simulator's virtual time)
    ticks: list[float] = field(default_factory=list)  # when each step was sent
    opened: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)
    started_at: float | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def open(self) -> None:
        self.started_at = anyio.current_time()
        self.opened.set()

    def tick(self) -> None:
        """The real play is about to send a step."""
        self.ticks.append(anyio.current_time())
        self._changed.set()
        self._changed = anyio.Event()

    def end(self) -> None:
        self.opened.set()
        self.ended.set()
        self._changed.set()

    def mean_gap(self, default: float) -> float:
        t = [self.started_at, *self.ticks] if self.started_at is not None else self.ticks
        if len(t) < 2:
            return default
        return (t[-1] - t[0]) / (len(t) - 1)

    async def turn(self, k: int, default_gap: float, last: list[float]) -> None:
        """Wait until the sibling sent its step ``k`` (0-based); past its end, one mean gap
        after this play's previous step (``last[0]``, updated here)."""
        while len(self.ticks) <= k and not self.ended.is_set():
            await self._changed.wait()
        if len(self.ticks) <= k:  # the sibling ended sooner: its mean gap, from our last step
            wait = last[0] + self.mean_gap(default_gap) - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
        last[0] = anyio.current_time()


class ScriptedResult(msgspec.Struct, kw_only=True):
    kind: str  # "solution" | "garbage"
    env_id: str
    seed: int
    won: bool = False
    reward: float = 0.0
    turns: int = 0
    calls: int = 0  # environment calls it made (open/reset/tools/steps/close)
    fault: str = ""  # an EnvError kind the environment caused ("" none)
    error: str = ""
    skipped: str = ""  # why it could not run (pool capacity, ...): no verdict


async def solution_for(
    pool: EnvPool, source: str, env_id: str, seed: int
) -> tuple[list[str] | None, int, str, str]:
    """``solution()`` for ``seed`` on an instance in a worker of its own (never the playing
    worker). Returns (actions or None for free text, calls, fault kind, error)."""
    from spade_async.envs.validate import solution_actions

    key = f"{env_id}~{uuid.uuid4().hex[:8]}"  # a pool key of its own: a fresh worker
    calls = 0
    try:
        inst = await pool.open(source, env_id=key)
        calls += 1
        try:
            await pool.reset(inst, seed)
            calls += 1
            value = await pool.solution(inst)
            calls += 1
        finally:
            calls += 1
            await pool.close(inst)
        return solution_actions(value), calls, "", ""
    except EnvError as exc:
        return None, calls, exc.kind, f"{exc.kind}: {exc.message}"
    finally:
        with anyio.CancelScope(shield=True):
            await pool.release(key)


async def scripted_play(
    pool: EnvPool,
    *,
    source: str,
    env_id: str,
    setting: str,
    seed: int,
    kind: str,
    actions: list[str],
    max_turns: int,
    pace: Pace,
    threshold: float,
    default_gap: float = 1.0,
) -> ScriptedResult:
    """Play ``actions`` (cycled for garbage, once for a solution) as the agent would, paced by
    ``pace``. Never raises for the environment's failures: they are the result's ``fault``."""
    from spade_async.rewards import agent_outcome

    res = ScriptedResult(kind=kind, env_id=env_id, seed=seed)
    inst = None
    last = [anyio.current_time()]
    try:
        inst = await pool.open(source, env_id=env_id)
        res.calls += 1
        await pool.reset(inst, seed)
        res.calls += 1
        last[0] = anyio.current_time()
        if setting == "tool_use":
            await pool.get_tools(inst)
            res.calls += 1
        for k in range(max_turns):
            if kind == "solution" and k >= len(actions):
                break
            action = actions[k % len(actions)]
            await pace.turn(k, default_gap, last)
            _, r, term, trunc, _ = await pool.step(inst, action)
            res.calls += 1
            res.turns += 1
            if term or trunc:
                res.reward = agent_outcome(r, term)
                res.won = res.reward >= threshold
                break
    except EnvError as exc:
        if exc.kind in ENV_FAULTS:
            res.fault, res.error = exc.kind, f"{exc.kind}: {exc.message}"
        else:
            res.skipped = f"{exc.kind}: {exc.message}"
    finally:
        if inst is not None:
            with anyio.CancelScope(shield=True):
                res.calls += 1
                await pool.close(inst)
    return res


_ANSWERS = re.compile(r"(\\boxed\{)([^{}]*)(\})|(<answer>)(.*?)(</answer>)", re.DOTALL)
_WORD = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"\d+")


def absurd(rng: random.Random, reply: str) -> str:
    """A policy reply to another environment made into garbage for this one, its shape
    kept (length, prose, formatting, tool-call JSON): every number becomes one no game
    here accepts (more digits than it had and the usual ranges), every word inside a
    ``\\boxed{...}`` or ``<answer>`` becomes random letters one longer. A reply that is a
    legal move elsewhere (``\\boxed{5}``, ``\\boxed{left}``) is then never a legal move
    here by chance, as the validator's garbage (``garbage.legal_looking``): an honest
    game that passed the gates does not lose to it, one that lets any reply win does."""
    from spade_async.envs.garbage import _absurd_int, _junk

    def inner(m: re.Match) -> str:
        if m.group(1):
            head, body, tail = m.group(1), m.group(2), m.group(3)
        else:
            head, body, tail = m.group(4), m.group(5), m.group(6)
        body = _WORD.sub(lambda w: _junk(rng, len(w.group()) + 1), body)
        return head + (body if body.strip() else _junk(rng)) + tail

    reply = _ANSWERS.sub(inner, reply)
    return _NUMBER.sub(lambda m: _absurd_int(rng, m.group()).lstrip("-"), reply)


def pick_garbage(rng: random.Random, replies: list[str], turns: int) -> list[str]:
    """``turns`` replies drawn (with replacement) from ``replies``, made absurd here."""
    return [absurd(rng, rng.choice(replies)) for _ in range(max(1, turns))]
