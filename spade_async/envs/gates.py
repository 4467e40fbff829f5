"""The strict gates' plays, shaped like training's (``validate.py`` runs them).

Every instance the gates use follows the sequence a training play does
(``roles/agent.play_episode``): ``open``, one ``reset(seed)``, ``get_tools()`` only when the
environment is not a games one, ``step()`` until the episode ends or ``max_turns`` steps
(the agent's limit), ``close()``, in the same worker type of the same pool. No instance is
reset twice, none is left unclosed, none is stepped past ``max_turns``. ``solution()``
runs on instances of its own (open, reset, solution, close: the hint writer's sequence),
never on one that is then played.

Two worker PROCESSES, A and B, reserved together and pinned for the check (never evicted
between two plays, so "the worker where solution() ran" stays one process): A plays the
garbage (a fresh instance per play); determinism replays garbage plays on fresh instances
in A (a later instance of the same process: an environment salted per instance differs)
and in B (salted per process differs); only then does A run ``solution()`` (on its own
instances), whose actions are replayed in B, which never ran ``solution()`` (a
``solution()`` with side effects cannot make its own replay win), and once more in A: a
divergence means nondeterminism, an instance that plays another game for the same seed, or
a ``solution()`` that changed its worker's game.
"""

from __future__ import annotations

import random
import secrets
import uuid
from collections.abc import Callable

import anyio

from spade_async.envs.garbage import REFERENCE_PROBE, garbage_plays, random_seeds, solution_actions
from spade_async.envs.pool import EnvError, EnvPool

__all__ = ["Gates", "Reject"]

RESOURCE = {"timeout": "timeout", "memory": "memory", "crash": "crash", "lost": "crash",
            "output_too_large": "output_too_large", "structure": "structure",
            "protocol": "protocol"}  # fmt: skip


class Reject(Exception):
    def __init__(self, stage: str, reason: str, feasibility: str | None = None) -> None:
        super().__init__(reason)
        self.stage, self.reason, self.feasibility = stage, reason, feasibility


Actions = list[str] | Callable[[str, list[dict]], list[str]]


class Gates:
    def __init__(
        self, pool: EnvPool, source: str, seeds: tuple[int, ...] | None, cfg, env_class: str,
        setting: str | None = None,
    ) -> None:  # fmt: skip
        self.pool, self.source, self.cfg = pool, source, cfg
        seed = cfg.probe_seed if cfg.probe_seed is not None else secrets.randbits(63)
        self.probe_seed = seed
        self.rng = random.Random(seed)  # the garbage: drawn afresh per check
        # no seeds given: drawn like training's (uniform over [0, 2**31)), afresh per check
        self.seeds = seeds or random_seeds(self.rng, cfg.random_seeds)
        # random ids (no "check" marker an environment could look for): two fresh workers
        self.env_ids = (uuid.uuid4().hex[:16], uuid.uuid4().hex[:16])
        self.stage = "load"
        self.env_class = env_class  # the static stage's answer, never the worker's
        self.setting = setting  # "games": no get_tools (as training); None: unknown, asked
        self.max_turns = max(1, cfg.max_turns)
        self.multi_turn: bool | None = None
        self.feasibility: str | None = None
        self.plays = 0  # instances played (open .. close), for the tests and the docs

    def _classify(self, exc: EnvError) -> Exception:
        if exc.kind in RESOURCE:
            return Reject(RESOURCE[exc.kind], f"during {self.stage}: {exc.message}")
        if exc.kind in ("busy", "boot"):
            return exc
        feas = "failed" if self.stage == "feasibility" else None
        return Reject(self.stage, f"{exc.kind}: {exc.message}", feas)

    async def call(self, coro):
        try:
            return await coro
        except EnvError as exc:
            raise self._classify(exc) from None

    async def reserve(self) -> None:
        """A worker of its own for A and B, booted concurrently, pinned for the check."""
        try:
            await self.pool.reserve(*self.env_ids)
        except EnvError as exc:
            raise self._classify(exc) from None
        for env_id in self.env_ids:
            self.pool.pin(env_id)

    async def play(
        self, env_id: str, seed: int, actions: Actions, *, stage: str, first: bool = False
    ) -> tuple[list[tuple], list[str]]:
        """One instance as a training play uses it: open, one reset, tools (not for a games
        environment), steps until the episode ends (at most ``max_turns``), close. The
        ``(obs, reward, terminated, truncated)`` trace and the actions played (``actions``
        may be made from the first observation and the tools). ``first``: this reset is the
        reset gate (its observation must not be empty)."""
        self.stage = "load"
        inst = await self.call(self.pool.open(self.source, env_id=env_id, env_class=self.env_class))
        self.plays += 1
        try:
            self.stage = "reset" if first else stage
            obs, _ = await self.call(self.pool.reset(inst, seed))
            if first and not obs.strip():
                raise Reject("reset", f"reset(seed={seed}) returned an empty observation")
            tools = await self.tools(inst) if self.setting != "games" else []
            self.stage = stage
            if callable(actions):
                actions = actions(obs, tools)
            trace: list[tuple] = [(obs,)]
            for action in actions[: self.max_turns]:
                obs, reward, term, trunc, _ = await self.call(self.pool.step(inst, action))
                trace.append((obs, reward, term, trunc))
                if term or trunc:
                    break
            return trace, actions
        finally:
            with anyio.CancelScope(shield=True):
                await self.pool.close(inst)

    async def tools(self, inst) -> list[dict]:
        """The environment's tools (none for one whose ``get_tools`` raises: tool garbage
        then just is not drawn)."""
        try:
            return await self.pool.get_tools(inst)
        except EnvError as exc:
            if exc.kind == "exception":
                return []
            raise self._classify(exc) from None

    async def run(self) -> None:
        await self.reserve()
        a, b = self.env_ids
        if self.cfg.gates == "reference":  # the ablation hook: validate_game's probe only
            await self.play(a, self.seeds[0], list(REFERENCE_PROBE), stage="step", first=True)
            return
        long_seed = self.rng.choice(self.seeds)  # one long play per check, on a random seed
        plays: dict[int, list[list[str]]] = {}
        traces: dict[int, list[list[tuple]]] = {}
        for seed in self.seeds:
            made: list[list[str]] = []

            def first_play(obs: str, tools: list[dict], seed: int = seed, made=made) -> list[str]:
                made.extend(garbage_plays(self.rng, obs, tools, self.cfg, long=seed == long_seed))
                return made[0]

            trace, _ = await self.play(a, seed, first_play, stage="step", first=True)
            plays[seed], traces[seed] = made, [trace]
            for p in made[1:]:
                traces[seed].append((await self.play(a, seed, p, stage="step"))[0])
        self.stage = "determinism"
        await self.deterministic(plays, traces)
        self.stage = "not_done_at_reset"
        self.not_won(plays, traces)
        self.multi_turn = any(len(t) > 1 and not t[1][2] for ts in traces.values() for t in ts)
        self.stage = "feasibility"
        await self.feasible()
        if self.cfg.require_multi_turn and not self.multi_turn:
            raise Reject("multi_turn", "the episode is solved in one action; it needs several")

    async def deterministic(self, plays: dict, traces: dict) -> None:
        """The garbage plays again on a later instance in A's worker and in B."""
        a, b = self.env_ids
        k = max(1, self.cfg.replayed_plays)
        for seed in self.seeds:
            pairs = list(zip(plays[seed], traces[seed], strict=True))
            # the longest of the several-turn plays (the long play is played once, in A)
            short = [pt for pt in pairs if len(pt[0]) <= self.cfg.garbage_turns] or pairs
            for play, ta in sorted(short, key=lambda pt: -len(pt[0]))[:k]:
                again, _ = await self.play(a, seed, play, stage="determinism")
                self.same(seed, ta, again, "", "instances in one worker")
                self.same(seed, ta, (await self.play(b, seed, play, stage="determinism"))[0], "")

    def not_won(self, plays: dict, traces: dict) -> None:
        thr = self.cfg.success_threshold
        for seed in self.seeds:
            for play, trace in zip(plays[seed], traces[seed], strict=True):
                for i, (_, reward, term, _) in enumerate(trace[1:]):
                    if reward >= thr:
                        shown = ", ".join(repr(x[:60]) for x in play[: i + 1])
                        raise Reject(
                            "not_done_at_reset",
                            f"garbage wins seed {seed} at turn {i + 1} (reward {reward:g}, "
                            f"terminated={term}); actions: {shown}",
                        )

    @staticmethod
    def same(
        seed: int, ta: list[tuple], tb: list[tuple], what: str, where: str = "worker processes"
    ) -> None:
        if ta[0] != tb[0]:
            raise Reject(
                "determinism", f"seed {seed}: two {where} show different first observations"
            )
        if ta != tb:
            i = next(
                (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                min(len(ta), len(tb)),
            )
            raise Reject(
                "determinism",
                f"seed {seed}: the same actions{what} diverge at step {i} in two {where}",
            )

    async def solution_of(self, seed: int) -> str | list[str]:
        """``solution()`` for ``seed`` on an instance of its own in A (open, reset,
        solution, close: the hint writer's sequence)."""
        self.stage = "load"
        inst = await self.call(
            self.pool.open(self.source, env_id=self.env_ids[0], env_class=self.env_class)
        )
        try:
            self.stage = "feasibility"
            await self.call(self.pool.reset(inst, seed))
            return await self.call(self.pool.solution(inst))
        finally:
            with anyio.CancelScope(shield=True):
                await self.pool.close(inst)

    async def second_opinion(self, seed: int, actions: list[str], trace: list[tuple]) -> None:
        """A failed replay, once more in a third fresh worker (only on this failure path):
        the same failure there is infeasibility; a different game is nondeterminism."""
        self.pool.unpin(self.env_ids[1])
        await self.pool.release(self.env_ids[1])  # B is done: its slot goes to C
        env_id = uuid.uuid4().hex[:16]
        self.env_ids += (env_id,)  # released with the others
        again, _ = await self.play(env_id, seed, actions, stage="feasibility")
        self.same(seed, again, trace, " of solution()")

    async def feasible(self) -> None:
        a, b = self.env_ids
        plans: dict[int, list[str]] = {}
        for seed in self.seeds:  # solution() runs in A only, on instances of its own
            actions = solution_actions(await self.solution_of(seed))
            if actions is None:
                self.feasibility = "unverified"
                return
            plans[seed] = actions
        steps_needed = []
        for seed, actions in plans.items():  # replayed in B, which never ran solution()
            trace, _ = await self.play(b, seed, actions, stage="feasibility")
            last = trace[-1]
            if len(trace) < 2 or not last[2] or last[1] < self.cfg.success_threshold:
                await self.second_opinion(seed, actions, trace)
                end = (
                    "no step"
                    if len(trace) < 2
                    else f"reward {last[1]:g}, terminated={last[2]}, truncated={last[3]}"
                )
                cut = (
                    f" (an episode ends at max_turns = {self.max_turns})"
                    if len(actions) > self.max_turns
                    else ""
                )
                raise Reject(
                    "feasibility",
                    f"seed {seed}: replaying solution() ({len(actions)} actions) in a fresh "
                    f"worker ends with {end}{cut}",
                    "failed",
                )
            steps_needed.append(len(trace) - 1)
            # the same replay in A, where solution() ran, must be the same game: a
            # solution() that changed the worker's state, or an instance that plays
            # another game for the same seed, diverges here
            again, _ = await self.play(a, seed, actions, stage="feasibility")
            self.same(seed, again, trace, " of solution()", "instances in one worker")
        self.feasibility = "proven"
        self.multi_turn = max(steps_needed) >= 2  # some seed needs several actions
