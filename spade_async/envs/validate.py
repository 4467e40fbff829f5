"""The validation gates of ENV_CONTRACT.md, in order; the first failure classifies the file.

syntax -> structure -> load -> reset -> step -> determinism -> not_done_at_reset ->
feasibility, with the resource stages (timeout, memory, crash, output_too_large, protocol)
reported whenever a call in any gate hits them. Everything untrusted runs in the pool's
sandbox; the static checks here only parse. A misbehaving environment always yields a
``Verdict``.

Gates a hostile environment cannot game. The checks use two worker PROCESSES, A and B,
opened together (two fresh workers, so the second costs no extra wall time when the pool
has pre-warmed ones): A takes reset/step/garbage; determinism compares first observations
and a replayed trajectory between A and B (an environment salted per process differs);
only then does A run ``solution()``, and its actions are replayed for feasibility in B,
which never ran ``solution()`` (a ``solution()`` with side effects cannot make its own
replay win), and then once more in A: a divergence means nondeterminism or a
``solution()`` that changed the game. The reported class is the one the static stage
found, loaded by that name; every value came through the parent's checks (replies.py).
"""

from __future__ import annotations

import ast
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from spade_async.config import Doc
from spade_async.envs.pool import EnvError, EnvPool, Instance, PoolConfig
from spade_async.envs.replies import clean_text
from spade_async.envs.static import StructureError, find_env_class, screen_imports
from spade_async.errors import UsageError

__all__ = [
    "Verdict",
    "ValidateConfig",
    "validate_source",
    "check_file",
    "solution_actions",
    "STAGES",
]

STAGES = ("syntax", "structure", "load", "reset", "step", "determinism", "not_done_at_reset",
          "feasibility", "timeout", "memory", "crash", "output_too_large", "protocol")  # fmt: skip
_RESOURCE = {"timeout": "timeout", "memory": "memory", "crash": "crash", "lost": "crash",
             "output_too_large": "output_too_large", "structure": "structure",
             "protocol": "protocol"}  # fmt: skip


REFERENCE_PROBE = ("1", "2", "test")  # the reference's utils/game_files.validate_game actions


class ValidateConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    success_threshold: Doc(float, "terminal reward that counts as solved") = 1.0
    garbage_actions: Doc(tuple[str, ...], "actions that must never crash nor win an episode") = (
        "", "\\boxed{}", "I am not sure what to do here.", "\\boxed{zzqx 9 -1 ???}",
        "<answer></answer>", "<tool_call>not json</tool_call>",
        '<tool_call>{"name": "no_such_tool", "arguments": {"x": 1}}</tool_call>',
    )  # fmt: skip
    max_solution_steps: Doc(int, "longest solution replayed") = 200
    require_multi_turn: Doc(bool, "reject environments solved in one action (stage multi_turn)") = (
        False
    )
    gates: Doc(
        Literal["strict", "reference"],
        "strict: every gate above; reference: only the reference's validate_game (load, reset, "
        "the actions '1', '2', 'test' until the episode ends), for ablations -- the strict "
        "gates reject designs the reference trains on, so they change designer rewards",
    ) = "strict"


class Verdict(msgspec.Struct, kw_only=True):
    valid: bool
    stage: str  # "ok" or the failing stage
    reason: str
    env_class: str | None = None
    multi_turn: bool | None = None
    feasibility: str | None = None  # "proven" | "unverified" | "failed" | None
    isolation: str = ""
    seconds: float = 0.0
    warnings: list[str] = []


class _Reject(Exception):
    def __init__(self, stage: str, reason: str, feasibility: str | None = None) -> None:
        super().__init__(reason)
        self.stage, self.reason, self.feasibility = stage, reason, feasibility


_TAGGED = re.compile(r"<tool_call>.*?</tool_call>|<answer>.*?</answer>", re.DOTALL)


def solution_actions(value: str | list[str]) -> list[str] | None:
    """Replayable actions from ``solution()``; None when it is free-text guidance."""
    if isinstance(value, list):
        return value
    if "<tool_call>" in value or "<answer>" in value:
        return _TAGGED.findall(value) or None
    lines = [ln.strip() for ln in value.splitlines() if ln.strip()]
    if lines and all("\\boxed{" in ln for ln in lines):
        return lines
    return None


class _Gates:
    def __init__(
        self, pool: EnvPool, source: str, seeds: tuple[int, ...], cfg: ValidateConfig,
        env_class: str,
    ) -> None:  # fmt: skip
        self.pool, self.source, self.seeds, self.cfg = pool, source, seeds, cfg
        # random ids (no "check" marker an environment could look for): two fresh workers
        self.env_ids = (uuid.uuid4().hex[:16], uuid.uuid4().hex[:16])
        self.stage = "load"
        self.env_class = env_class  # the static stage's answer, never the worker's
        self.multi_turn: bool | None = None
        self.feasibility: str | None = None

    def _classify(self, exc: EnvError) -> Exception:
        if exc.kind in _RESOURCE:
            return _Reject(_RESOURCE[exc.kind], f"during {self.stage}: {exc.message}")
        if exc.kind in ("busy", "boot"):
            return exc
        feas = "failed" if self.stage == "feasibility" else None
        return _Reject(self.stage, f"{exc.kind}: {exc.message}", feas)

    async def call(self, coro):
        try:
            return await coro
        except EnvError as exc:
            raise self._classify(exc) from None

    async def open_pair(self) -> tuple[Instance, Instance]:
        """Instances in two separate worker processes, opened concurrently."""
        out: dict[int, Instance | EnvError] = {}
        try:
            await self.pool.reserve(*self.env_ids)  # both boot at once
        except EnvError as exc:
            raise self._classify(exc) from None

        async def one(i: int) -> None:
            try:
                out[i] = await self.pool.open(
                    self.source, env_id=self.env_ids[i], env_class=self.env_class
                )
            except EnvError as exc:
                out[i] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            tg.start_soon(one, 1)
        for i in (0, 1):
            if isinstance(out[i], EnvError):
                raise self._classify(out[i])
        return out[0], out[1]

    async def episode(self, inst: Instance, seed: int, actions: list[str]) -> list[tuple]:
        """Reset and play ``actions`` until the episode ends; the (obs, r, term, trunc) trace."""
        obs, _ = await self.call(self.pool.reset(inst, seed))
        trace = [(obs,)]
        for action in actions[: self.cfg.max_solution_steps]:
            obs, reward, term, trunc, _ = await self.call(self.pool.step(inst, action))
            trace.append((obs, reward, term, trunc))
            if term or trunc:
                break
        return trace

    async def run(self) -> None:
        a, b = await self.open_pair()
        if self.cfg.gates == "reference":  # the ablation hook: validate_game's probe only
            self.stage = "step"
            await self.episode(a, self.seeds[0], list(REFERENCE_PROBE))
            return
        self.stage = "reset"
        for seed in self.seeds:
            obs, _ = await self.call(self.pool.reset(a, seed))
            if not obs.strip():
                raise _Reject("reset", f"reset(seed={seed}) returned an empty observation")
        self.stage = "step"
        garbage: list[tuple[int, str, tuple]] = []
        for seed in self.seeds:
            for action in self.cfg.garbage_actions:
                trace = await self.episode(a, seed, [action])
                garbage.append((seed, action, trace[1]))
        self.stage = "determinism"
        probe = list(self.cfg.garbage_actions)
        for seed in self.seeds:
            ta, tb = await self.episode(a, seed, probe), await self.episode(b, seed, probe)
            self.same(seed, ta, tb, "")
        self.stage = "not_done_at_reset"
        thr = self.cfg.success_threshold
        for seed, action, (_, reward, term, _) in garbage:
            if reward >= thr:
                raise _Reject(
                    "not_done_at_reset",
                    f"garbage action {action!r} wins seed {seed} (reward {reward:g}, terminated={term})",
                )
        self.multi_turn = any(not term for _, _, (_, _, term, _) in garbage)
        self.stage = "feasibility"
        await self.feasible(a, b)
        if self.cfg.require_multi_turn and not self.multi_turn:
            raise _Reject("multi_turn", "the episode is solved in one action; it needs several")

    @staticmethod
    def same(seed: int, ta: list[tuple], tb: list[tuple], what: str) -> None:
        if ta[0] != tb[0]:
            raise _Reject(
                "determinism",
                f"seed {seed}: two worker processes show different first observations",
            )
        if ta != tb:
            i = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
            raise _Reject(
                "determinism",
                f"seed {seed}: the same actions{what} diverge at step {i} in two worker processes",
            )

    async def second_opinion(self, seed: int, actions: list[str], trace: list[tuple]) -> None:
        """A failed replay, once more in a third fresh worker (only on this failure path):
        the same failure there is infeasibility; a different game is nondeterminism."""
        await self.pool.release(self.env_ids[1])  # B is done: its slot goes to C
        env_id = uuid.uuid4().hex[:16]
        self.env_ids += (env_id,)  # released with the others
        c = await self.call(self.pool.open(self.source, env_id=env_id, env_class=self.env_class))
        self.same(seed, await self.episode(c, seed, actions), trace, " of solution()")

    async def feasible(self, a: Instance, b: Instance) -> None:
        plans: dict[int, list[str]] = {}
        for seed in self.seeds:  # solution() runs in A only
            await self.call(self.pool.reset(a, seed))
            actions = solution_actions(await self.call(self.pool.solution(a)))
            if actions is None:
                self.feasibility = "unverified"
                return
            plans[seed] = actions
        steps_needed = []
        for seed, actions in plans.items():  # replayed in B, which never ran solution()
            trace = await self.episode(b, seed, actions)
            last = trace[-1]
            if len(trace) < 2 or not last[2] or last[1] < self.cfg.success_threshold:
                await self.second_opinion(seed, actions, trace)
                end = (
                    "no step"
                    if len(trace) < 2
                    else f"reward {last[1]:g}, terminated={last[2]}, truncated={last[3]}"
                )
                raise _Reject(
                    "feasibility",
                    f"seed {seed}: replaying solution() ({len(actions)} actions) in a fresh "
                    f"worker ends with {end}",
                    "failed",
                )
            steps_needed.append(len(trace) - 1)
            # the same replay in A (which ran solution()) must be the same game
            self.same(seed, await self.episode(a, seed, actions), trace, " of solution()")
        self.feasibility = "proven"
        self.multi_turn = max(steps_needed) >= 2  # some seed needs several actions


async def validate_source(
    source: str, *, pool: EnvPool, seeds: tuple[int, ...] | list[int] = (0, 1, 2),
    config: ValidateConfig | None = None,
) -> Verdict:  # fmt: skip
    """Run every gate on ``source`` in ``pool``'s sandbox. Never raises for a bad environment."""
    if pool.config.max_workers < 2:
        raise UsageError(
            f"envs.max_workers = {pool.config.max_workers}: the validation gates compare two "
            "worker processes; set envs.max_workers to 2 or more"
        )
    t0 = time.perf_counter()
    cfg = config or ValidateConfig()
    seeds = tuple(seeds) or (0,)
    warnings: list[str] = []
    gates: _Gates | None = None
    try:
        if not source.strip():
            raise _Reject("syntax", "the source is empty")
        try:
            source.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Reject(
                "syntax", f"the source is not valid Unicode ({exc.reason} at {exc.start})"
            ) from None
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError) as exc:
            where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
            raise _Reject("syntax", f"{where}{getattr(exc, 'msg', None) or exc}") from None
        env_class = find_env_class(tree)  # StructureError with the reason
        warnings += screen_imports(tree)
        gates = _Gates(pool, source, seeds, cfg, env_class)
        try:
            await gates.run()
        finally:
            with anyio.CancelScope(shield=True):
                for env_id in gates.env_ids:
                    await pool.release(env_id)
        stage, valid, reason = "ok", True, _ok_reason(gates, seeds)
        feas = gates.feasibility
    except _Reject as rej:
        stage, valid, reason, feas = rej.stage, False, rej.reason, rej.feasibility
        env_class = gates.env_class if gates else None
    except StructureError as exc:
        stage, valid, reason, feas, env_class = "structure", False, str(exc), None, None
    return Verdict(
        valid=valid, stage=stage, reason=clean_text(reason, 4000), env_class=env_class,
        multi_turn=gates.multi_turn if gates else None, feasibility=feas,
        isolation=pool.isolation, seconds=round(time.perf_counter() - t0, 4), warnings=warnings,
    )  # fmt: skip


def _ok_reason(g: _Gates, seeds: tuple[int, ...]) -> str:
    feas = {
        "proven": "solution() replays to success",
        "unverified": "solution() is free text (unverified)",
    }
    return f"all gates pass on seeds {list(seeds)}; {feas.get(g.feasibility or '', '')}"


def read_source(path: str | Path) -> str | Verdict:
    """File text, or a syntax-stage Verdict for empty/binary files; UsageError if missing."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"environment file '{p}' does not exist")
    if not p.is_file():
        raise UsageError(f"'{p}' is not a file; pass an environment .py file")
    data = p.read_bytes()
    bad = None
    if b"\x00" in data:
        bad = "the file is binary (contains NUL bytes), not Python source"
    else:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    return Verdict(valid=False, stage="syntax", reason=bad)


def check_file(
    path: str | Path, seeds: tuple[int, ...] | list[int] = (0, 1, 2), *,
    config: ValidateConfig | None = None, pool_config: PoolConfig | None = None,
) -> Verdict:  # fmt: skip
    """Synchronous one-shot check of a file in a pool of its own."""
    source = read_source(path)
    pc = pool_config or PoolConfig(prewarm=0, max_workers=2)  # the two gate workers boot together

    async def go() -> Verdict:
        async with EnvPool(pc) as pool:
            if isinstance(source, Verdict):
                source.isolation = pool.isolation
                return source
            return await validate_source(source, pool=pool, seeds=seeds, config=config)

    return anyio.run(go)


if __name__ == "__main__":  # python -m spade_async.envs.validate FILE
    print(msgspec.json.encode(check_file(sys.argv[1])).decode())
