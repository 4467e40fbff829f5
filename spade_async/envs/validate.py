"""The validation gates of docs/environments.md, in order; the first failure classifies the file.

syntax -> structure -> load -> reset -> step -> determinism -> not_done_at_reset ->
feasibility, with the resource stages (timeout, memory, crash, output_too_large, protocol)
reported whenever a call in any gate hits them. Everything untrusted runs in the pool's
sandbox; the static checks here only parse. A misbehaving environment always yields a
``Verdict``.

Gates a hostile environment cannot game (``gates.py``). Every instance they use is played
as training plays one: open, one reset, steps up to ``max_turns`` (the agent's), close, in
the same pool's workers; ``solution()`` runs on instances of its own. Two worker PROCESSES,
A and B: A plays the garbage; determinism replays garbage plays on a later instance in A
(salted per instance differs) and in B (salted per process differs); A then runs
``solution()``, whose actions are replayed in B, which never ran it, and once more in A.
docs/audits.md lists what still differs from a training play, and why each is harmless;
the audits inside training (``envs/audit.py``) catch what an environment does differently
there.

What an environment cannot recognise: the seeds are drawn at random per check unless the
caller names them (uniform over [0, 2**31), as training draws an episode's), so a game honest
only for well-known seeds fails; the garbage is drawn at random per check
(``garbage.py``: random text, legal-looking commands made from the observation's own
``\\boxed{...}`` examples with values no game accepts, tool calls with the environment's
own tool names and random arguments, wrong non-empty answers) and played for several turns
(one play per check, on a random seed, for ``long_turns`` capped at ``max_turns``: as long
as an episode), with the contract's fixed probes (``ValidateConfig.garbage_actions``) each
leading a play of random turns, in a random order. The worker is told the same things by
validation and by training (the pool's ``Open`` carries the worker's own random id and the
static class name, whoever asks), so "am I being validated" has no answer in the messages.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import time
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from spade_async.config import Doc
from spade_async.envs.garbage import (  # noqa: F401  (the public names stay here)
    REFERENCE_PROBE,
    garbage_plays,
    legal_looking,
    random_seeds,
    random_text,
    solution_actions,
    tool_garbage,
)
from spade_async.envs.gates import Gates, Reject
from spade_async.envs.pool import EnvPool, PoolConfig
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
    max_turns: Doc(
        int,
        "steps of any validation play at most, as a training play's agent.max_turns (25 in "
        "every recipe): the long garbage play and a solution's replay stop there too",
    ) = 25
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


async def validate_source(
    source: str, *, pool: EnvPool, seeds: tuple[int, ...] | list[int] | None = None,
    config: ValidateConfig | None = None, setting: str | None = None,
) -> Verdict:  # fmt: skip
    """Run every gate on ``source`` in ``pool``'s sandbox. Never raises for a bad environment.
    ``setting``: "games" plays it as training plays a games environment (no ``get_tools``);
    None (unknown) asks for its tools.
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
    gates: Gates | None = None
    try:
        source = source.removeprefix("\ufeff")  # a byte-order mark: Python's reader drops it
        if not source.strip():
            raise Reject("syntax", "the source is empty")
        try:
            source.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Reject(
                "syntax", f"the source is not valid Unicode ({exc.reason} at {exc.start})"
            ) from None
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError) as exc:
            where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
            raise Reject("syntax", f"{where}{getattr(exc, 'msg', None) or exc}") from None
        env_class = find_env_class(tree)  # StructureError with the reason
        warnings += screen_imports(tree)
        gates = Gates(pool, source, seeds, cfg, env_class, setting)
        try:
            await gates.run()
        finally:
            with anyio.CancelScope(shield=True):
                for env_id in gates.env_ids:
                    pool.unpin(env_id)
                    await pool.release(env_id)
        stage, valid, reason = "ok", True, _ok_reason(gates)
        feas = gates.feasibility
    except Reject as rej:
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


def _ok_reason(g: Gates) -> str:
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
