"""The validation gates of ENV_CONTRACT.md, in order; the first failure classifies the file.

syntax -> structure -> load -> reset -> step -> determinism -> not_done_at_reset ->
feasibility, with the resource stages (timeout, memory, crash, output_too_large, protocol)
reported whenever a call in any gate hits them. Everything untrusted runs in the pool's
sandbox; the static checks here only parse. A misbehaving environment always yields a
``Verdict``.

Gates a hostile environment cannot game. The checks use two worker PROCESSES, A and B,
opened together (two fresh workers, so the second costs no extra wall time when the pool
has pre-warmed ones): A takes reset/step/garbage; determinism compares first observations
and replayed garbage plays between A, a second instance A2 inside A's worker, and B (an
environment salted per process, or per instance, differs); only then does A run
``solution()``, and its actions are replayed for feasibility in B, which never ran
``solution()`` (a ``solution()`` with side effects cannot make its own replay win), and
then once more in A2: a divergence means nondeterminism, an instance that plays another
game for the same seed, or a ``solution()`` that changed its worker's game. The reported class is the one the static stage found, loaded by that name; every
value came through the parent's checks (replies.py).

What an environment cannot recognise: the seeds are drawn at random per check unless the
caller names them (uniform over [0, 2**31), as training draws an episode's), so a game honest
only for well-known seeds fails; the garbage is drawn at random per check
(``garbage_plays``: random text, legal-looking commands made from the observation's own
``\\boxed{...}`` examples with values no game accepts, tool calls with the environment's
own tool names and random arguments, wrong non-empty answers) and played for several turns
(one play per check, on a random seed, for ``long_turns``, past any recipe's episode
length),
with the contract's fixed probes (``ValidateConfig.garbage_actions``) each leading a play of
random turns, in a random order. The worker is told the same things by validation and by
training (the pool's ``Open`` carries the worker's own random id and the static class
name, whoever asks), so "am I being validated" has no answer in the messages.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import re
import secrets
import string
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
    "garbage_plays",
    "random_text",
    "random_seeds",
    "legal_looking",
    "tool_garbage",
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
    garbage_turns: Doc(
        int, "turns of each garbage play (several: a later nonsense reply must not win)"
    ) = 4
    random_plays: Doc(
        int, "garbage plays of random turns only, per seed (besides the fixed-led ones)"
    ) = 2
    long_turns: Doc(
        int,
        "turns of one more garbage play per check (on a seed drawn at random), longer than "
        "any recipe's agent.max_turns (25): nonsense that wins only late must not pass",
    ) = 30
    random_seeds: Doc(
        int,
        "seeds drawn at random per check, from [0, 2**31) as training draws them, when no "
        "seeds are given (an environment honest only for well-known seeds cannot pass)",
    ) = 3
    replayed_plays: Doc(
        int, "garbage plays per seed (the longest) replayed in A2 and B for determinism"
    ) = 1
    probe_seed: Doc(
        int | None, "seed of the random garbage; None = fresh per check (set to reproduce one)"
    ) = None
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
    seeds: list[int] = []  # the seeds the gates played (drawn per check unless given)
    probe_seed: int | None = None  # the garbage's seed: ValidateConfig.probe_seed reproduces it


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


_WORDS = ("maybe", "hello", "pass", "ok", "what", "the", "answer", "is", "try", "again", "no",
          "yes", "left", "up", "done", "win", "I", "think", "so", "please", "next", "skip")  # fmt: skip
_BOXED = re.compile(r"\\boxed\{\{?([^{}\n]{1,60})\}")
_DIGITS = re.compile(r"\d+")


def _junk(rng: random.Random, n: int = 0) -> str:
    n = n or rng.randint(3, 10)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def _absurd_int(rng: random.Random, like: str = "") -> str:
    """An integer no game here would accept: more digits than ``like`` and the usual ranges."""
    return str(rng.randint(10 ** (len(like) + 5), 10 ** (len(like) + 9)) * rng.choice((1, -1)))


def random_text(rng: random.Random) -> str:
    """Nonsense prose (a sentence: capitalised), sometimes with a boxed nonsense command."""
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 9))).capitalize()
    pick = rng.random()
    if pick < 0.3:
        return f"{words} \\boxed{{{_junk(rng)} {_absurd_int(rng)}}}"
    if pick < 0.5:
        return f"\\boxed{{{_junk(rng)}}}"
    return words + rng.choice(("", ".", "?", " " + _junk(rng)))


def legal_looking(rng: random.Random, obs: str) -> str:
    """A command in the form the observation's own ``\\boxed{...}`` examples use, with
    values no game accepts: numbers longer than any in the example, placeholders (one
    letter, or a short capital name) as absurd numbers; a command with no value to change
    gets one of its words replaced by random letters of the same length."""
    templates = [t.strip() for t in _BOXED.findall(obs) if t.strip()]
    words = [w for w in re.findall(r"[A-Za-z]{3,}", obs)]
    if not templates:
        word = rng.choice(words) if words else _junk(rng)
        return f"\\boxed{{{word} {_absurd_int(rng)}}}"
    tokens, changed = rng.choice(templates).split(), False
    for i, tok in enumerate(tokens):
        if _DIGITS.search(tok):
            tokens[i] = _DIGITS.sub(lambda m: _absurd_int(rng, m.group()).lstrip("-"), tok)
            changed = True
        elif re.fullmatch(r"[A-Za-z]|[A-Z]{1,3}", tok) or not tok.isalnum():
            tokens[i] = _absurd_int(rng)
            changed = True
    if not changed:
        i = rng.randrange(len(tokens))
        tokens[i] = _junk(rng, len(tokens[i]) + 1)
    return f"\\boxed{{{' '.join(tokens)}}}"


def tool_garbage(rng: random.Random, tools: list[dict]) -> str:
    """A call to one of the environment's own tools with random arguments, or a wrong
    non-empty answer (random words or a number far from any plausible answer)."""
    names = [
        t.get("function", t).get("name") for t in tools if isinstance(t.get("function", t), dict)
    ]
    names = [n for n in names if isinstance(n, str)]
    if names and rng.random() < 0.5:
        fn = next(
            (t.get("function", t) for t in tools if t.get("function", t).get("name") == (name := rng.choice(names))),
            {},
        )  # fmt: skip
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = {
            k: rng.choice((_junk(rng), rng.randint(-9999, 9999), rng.random() * 1e6))
            for k in (props if isinstance(props, dict) else {})
        }
        args = args or {_junk(rng, 4): _junk(rng)}
        body = json.dumps({"name": name, "arguments": args})
        return f"<tool_call>{body}</tool_call>"
    answer = rng.choice(
        (f"{_junk(rng)} {_junk(rng)}", _absurd_int(rng), f"{rng.random() * 1e9:.3f}", _junk(rng))
    )
    return f"<answer>{answer}</answer>"


def garbage_plays(
    rng: random.Random, obs: str, tools: list[dict], cfg: ValidateConfig, long: bool = True
) -> list[list[str]]:
    """The garbage played on one seed: ``cfg.random_plays`` plays of ``cfg.garbage_turns``
    turns drawn from random text, legal-looking commands and (for a tool-use environment,
    one with tools) tool garbage, and each fixed probe of ``cfg.garbage_actions`` as a play
    of its own (the contract's minimum: every one of them is stepped); in a random order."""

    def turn() -> str:
        kinds = [random_text, lambda r: legal_looking(r, obs)]
        if tools:
            kinds.append(lambda r: tool_garbage(r, tools))
        return rng.choice(kinds)(rng)

    plays = [[fixed] for fixed in cfg.garbage_actions]
    plays += [
        [turn() for _ in range(max(1, cfg.garbage_turns))] for _ in range(max(1, cfg.random_plays))
    ]
    if long and cfg.long_turns > cfg.garbage_turns:
        plays.append([turn() for _ in range(cfg.long_turns)])
    rng.shuffle(plays)
    return plays


def random_seeds(rng: random.Random, n: int) -> tuple[int, ...]:
    """``n`` distinct seeds as training draws an episode's (``rng.integers(2**31)``)."""
    out: list[int] = []
    while len(out) < max(1, n):
        s = rng.randrange(2**31)
        if s not in out:
            out.append(s)
    return tuple(out)


class _Gates:
    def __init__(
        self, pool: EnvPool, source: str, seeds: tuple[int, ...] | None, cfg: ValidateConfig,
        env_class: str,
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
        first: dict[int, str] = {}
        for seed in self.seeds:
            obs, _ = await self.call(self.pool.reset(a, seed))
            if not obs.strip():
                raise _Reject("reset", f"reset(seed={seed}) returned an empty observation")
            first[seed] = obs
        self.stage = "step"
        tools = await self.tools(a)
        long_seed = self.rng.choice(self.seeds)  # one long play per check, on a random seed
        plays = {
            s: garbage_plays(self.rng, first[s], tools, self.cfg, long=s == long_seed)
            for s in self.seeds
        }
        traces = {s: [await self.episode(a, s, p) for p in plays[s]] for s in self.seeds}
        self.stage = "determinism"
        a2 = await self.deterministic(a, b, plays, traces)
        self.stage = "not_done_at_reset"
        self.not_won(plays, traces)
        self.multi_turn = any(len(t) > 1 and not t[1][2] for ts in traces.values() for t in ts)
        self.stage = "feasibility"
        await self.feasible(a, b, a2)
        if self.cfg.require_multi_turn and not self.multi_turn:
            raise _Reject("multi_turn", "the episode is solved in one action; it needs several")

    async def tools(self, inst: Instance) -> list[dict]:
        """The environment's tools (none for a games environment, or one whose
        ``get_tools`` raises: tool garbage then just is not drawn)."""
        try:
            return await self.pool.get_tools(inst)
        except EnvError as exc:
            if exc.kind == "exception":
                return []
            raise self._classify(exc) from None

    async def deterministic(self, a: Instance, b: Instance, plays: dict, traces: dict) -> Instance:
        """The garbage plays again in a second instance A2 inside A's worker and in B.
        Returns A2 (feasibility replays the solution there too)."""
        a2 = await self.call(
            self.pool.open(self.source, env_id=self.env_ids[0], env_class=self.env_class, beside=a)
        )
        k = max(1, self.cfg.replayed_plays)
        for seed in self.seeds:
            pairs = list(zip(plays[seed], traces[seed], strict=True))
            # the longest of the several-turn plays (the long_turns play is played once, in A:
            # replaying it twice more per seed would cost more than what it adds here)
            short = [pt for pt in pairs if len(pt[0]) <= self.cfg.garbage_turns] or pairs
            for play, ta in sorted(short, key=lambda pt: -len(pt[0]))[:k]:
                self.same(
                    seed, ta, await self.episode(a2, seed, play), "", "instances in one worker"
                )
                self.same(seed, ta, await self.episode(b, seed, play), "")
        return a2

    def not_won(self, plays: dict, traces: dict) -> None:
        thr = self.cfg.success_threshold
        for seed in self.seeds:
            for play, trace in zip(plays[seed], traces[seed], strict=True):
                for i, (_, reward, term, _) in enumerate(trace[1:]):
                    if reward >= thr:
                        shown = ", ".join(repr(x[:60]) for x in play[: i + 1])
                        raise _Reject(
                            "not_done_at_reset",
                            f"garbage wins seed {seed} at turn {i + 1} (reward {reward:g}, "
                            f"terminated={term}); actions: {shown}",
                        )

    @staticmethod
    def same(
        seed: int, ta: list[tuple], tb: list[tuple], what: str, where: str = "worker processes"
    ) -> None:
        if ta[0] != tb[0]:
            raise _Reject(
                "determinism", f"seed {seed}: two {where} show different first observations"
            )
        if ta != tb:
            i = next(
                (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                min(len(ta), len(tb)),
            )
            raise _Reject(
                "determinism",
                f"seed {seed}: the same actions{what} diverge at step {i} in two {where}",
            )

    async def second_opinion(self, seed: int, actions: list[str], trace: list[tuple]) -> None:
        """A failed replay, once more in a third fresh worker (only on this failure path):
        the same failure there is infeasibility; a different game is nondeterminism."""
        await self.pool.release(self.env_ids[1])  # B is done: its slot goes to C
        env_id = uuid.uuid4().hex[:16]
        self.env_ids += (env_id,)  # released with the others
        c = await self.call(self.pool.open(self.source, env_id=env_id, env_class=self.env_class))
        self.same(seed, await self.episode(c, seed, actions), trace, " of solution()")

    async def feasible(self, a: Instance, b: Instance, a2: Instance) -> None:
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
            # the same replay in A2, a second instance in the worker where solution() ran,
            # must be the same game: a solution() that changed the worker's state, or an
            # instance that plays another game for the same seed, diverges here
            self.same(
                seed, await self.episode(a2, seed, actions), trace, " of solution()",
                "instances in one worker",
            )  # fmt: skip
        self.feasibility = "proven"
        self.multi_turn = max(steps_needed) >= 2  # some seed needs several actions


async def validate_source(
    source: str, *, pool: EnvPool, seeds: tuple[int, ...] | list[int] | None = None,
    config: ValidateConfig | None = None,
) -> Verdict:  # fmt: skip
    """Run every gate on ``source`` in ``pool``'s sandbox. Never raises for a bad environment.
    ``seeds``: the seeds the gates play; None (or empty) = ``config.random_seeds`` drawn at
    random per check, as training draws them (the verdict's reason names them)."""
    if pool.config.max_workers < 2:
        raise UsageError(
            f"envs.max_workers = {pool.config.max_workers}: the validation gates compare two "
            "worker processes; set envs.max_workers to 2 or more"
        )
    t0 = time.perf_counter()
    cfg = config or ValidateConfig()
    seeds = tuple(seeds or ())
    warnings: list[str] = []
    gates: _Gates | None = None
    try:
        source = source.removeprefix("\ufeff")  # a byte-order mark: Python's reader drops it
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
        stage, valid, reason = "ok", True, _ok_reason(gates)
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
        seeds=list(gates.seeds) if gates else list(seeds),
        probe_seed=gates.probe_seed if gates else None,
    )  # fmt: skip


def _ok_reason(g: _Gates) -> str:
    feas = {
        "proven": "solution() replays to success",
        "unverified": "solution() is free text (unverified)",
    }
    return f"all gates pass on seeds {list(g.seeds)}; {feas.get(g.feasibility or '', '')}"


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
        try:  # as Python reads a source file: BOM, coding cookie, universal newlines
            return importlib.util.decode_source(data)
        except UnicodeDecodeError as exc:
            bad = f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})"
        except (SyntaxError, LookupError) as exc:  # a bad or unknown coding cookie
            bad = f"the file's encoding declaration is unusable ({exc})"
    return Verdict(valid=False, stage="syntax", reason=bad)


def check_file(
    path: str | Path, seeds: tuple[int, ...] | list[int] | None = None, *,
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
