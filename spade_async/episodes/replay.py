"""Re-run recorded episodes in the sandbox pool and compare every observation and reward.

A record replays *exactly* when the environment's current source has the recorded hash,
``reset(seed)`` gives the recorded first observation, and each recorded action gives the
recorded observation, reward and (terminated, truncated); an episode the environment
failed must fail again with the same error kind at the same call. Anything else is a
mismatch naming the first call that differs. The source comes from the run's memory
(``memory.lmdb``), else ``envs/<id>.py``; the pool is configured by the run's
``config.toml`` (``envs``), as in training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import msgspec

from spade_async.envs.pool import EnvError, EnvPool, PoolConfig
from spade_async.episodes.records import (
    EpisodeRecord,
    Outcome,
    Summary,
    Verdict,
    code_sha256,
    read_summary,
    write_summary,
)
from spade_async.roles.agent import obs_hash

# failures of the pool, not of the episode's environment: an instance lost with a worker
# that another episode of the same environment crashed, no free worker, a worker that did
# not boot. A record cut by one replays up to the cut; a replay hit by one checked nothing.
INTERRUPTED = frozenset({"lost", "busy", "boot"})

__all__ = ["Outcome", "Summary", "read_summary", "replay_one", "replay_records", "summarize",
           "write_summary"]  # fmt: skip


def sources(run_dir: Path) -> Callable[[str], str | None]:
    """env_id -> the source the run holds for it (memory first, then ``envs/<id>.py``)."""
    store = None
    if (run_dir / "memory.lmdb" / "data.mdb").is_file():
        from spade_async.memory.store import open_checked

        store = open_checked(run_dir / "memory.lmdb")  # damaged: one line, exit 2
    cache: dict[str, str | None] = {}

    def get(env_id: str) -> str | None:
        if env_id not in cache:
            rec = store.get(env_id) if store is not None else None
            path = run_dir / "envs" / f"{Path(env_id).name}.py"
            if rec is not None:
                cache[env_id] = rec.code
            elif path.is_file():
                cache[env_id] = path.read_text(errors="replace")
            else:
                cache[env_id] = None
        return cache[env_id]

    get.close = store.close if store is not None else (lambda: None)  # type: ignore[attr-defined]
    return get


def pool_config(run_dir: Path) -> PoolConfig:
    """The run's sandbox settings (``envs``), few workers; defaults without a config; a
    config.toml that is not TOML or holds a wrong type is refused as a resume refuses it."""
    cfg = PoolConfig()
    if (run_dir / "config.toml").is_file():
        from spade_async.recipe import read_run_config

        cfg = read_run_config(run_dir / "config.toml")[1].envs
    return msgspec.structs.replace(cfg, prewarm=0, max_workers=min(cfg.max_workers, 4))


async def replay_one(pool: EnvPool, rec: EpisodeRecord, source: str | None) -> Outcome:
    def out(verdict: Verdict, call: int | None = None, detail: str = "") -> Outcome:
        return Outcome(id=rec.id, env_id=rec.env_id, verdict=verdict, call=call, detail=detail)

    if source is None:
        return out("no_code", detail="the run holds no source for this environment")
    if code_sha256(source) != rec.code_sha256:
        return out("code_changed", detail="the stored source differs from the one played")
    done = 0  # observation calls completed (reset = 1, then one per step)
    inst = None
    try:
        inst = await pool.open(source, env_id=rec.env_id)
        obs, _ = await pool.reset(inst, rec.seed)
        if not rec.obs_hashes:
            if rec.error_kind in INTERRUPTED:  # the run's pool cut it before its reset answered
                return out("exact")
            return out("mismatch", 0, "the run's reset failed; the replay's succeeded")
        if obs_hash(obs) != rec.obs_hashes[0]:
            return out("mismatch", 0, "reset observation differs")
        done = 1
        if rec.setting == "tool_use":
            await pool.get_tools(inst)  # the loop asks for the tools before the first step
        for k, action in enumerate(rec.actions, start=1):
            if k >= len(rec.obs_hashes) and rec.error_kind in INTERRUPTED:
                break  # the run's pool cut the episode here: the record ends, all of it matched
            obs, reward, term, trunc, _ = await pool.step(inst, action)
            if k >= len(rec.obs_hashes):
                return out("mismatch", k, "the run's step failed here; the replay's succeeded")
            if obs_hash(obs) != rec.obs_hashes[k]:
                return out("mismatch", k, "observation differs")
            if float(reward) != rec.step_rewards[k - 1]:
                return out(
                    "mismatch", k, f"reward {reward!r} != recorded {rec.step_rewards[k - 1]!r}"
                )
            if (bool(term), bool(trunc)) != tuple(rec.step_flags[k - 1]):
                return out("mismatch", k, "terminated/truncated differ")
            done = k + 1
    except EnvError as exc:
        if rec.error_kind == exc.kind and done == len(rec.obs_hashes):
            return out("exact")
        if exc.kind in INTERRUPTED:  # the replay's own pool failed: nothing was compared
            return out("not_checked", done, f"the replay's pool failed: {exc.message[:200]}")
        return out("mismatch", done, f"replay raised {exc.kind}: {exc.message[:200]}")
    finally:
        if inst is not None:
            await pool.close(inst)
    if rec.error_kind and rec.error_kind not in INTERRUPTED:
        return out("mismatch", done, f"the run ended in {rec.error_kind}; the replay did not")
    return out("exact")


async def replay_records(
    run_dir: Path, records: list[EpisodeRecord], *, concurrency: int = 4,
    config: PoolConfig | None = None,
) -> list[Outcome]:  # fmt: skip
    """Replay ``records`` (results in their order) in one pool, ``concurrency`` episodes of
    different environments at once."""
    get = sources(run_dir)
    results: list[Outcome | None] = [None] * len(records)
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    try:
        async with EnvPool(config or pool_config(run_dir)) as pool:
            # one environment's episodes one after another: they share its worker, and one
            # that crashes it must not cut another short (the run's "lost" instances)
            locks = {rec.env_id: anyio.Lock() for rec in records}

            async def one(i: int, rec: EpisodeRecord) -> None:
                async with limiter, locks[rec.env_id]:
                    results[i] = await replay_one(pool, rec, get(rec.env_id))

            async with anyio.create_task_group() as tg:
                for i, rec in enumerate(records):
                    tg.start_soon(one, i, rec)
    finally:
        get.close()  # type: ignore[attr-defined]
    return [r for r in results if r is not None]


def summarize(outcomes: list[Outcome]) -> Summary:
    exact = sum(o.exact for o in outcomes)
    flagged = Counter(o.env_id for o in outcomes if not o.exact)
    return Summary(
        checked=len(outcomes),
        exact=exact,
        share=exact / len(outcomes) if outcomes else 0.0,
        by_verdict=dict(Counter(o.verdict for o in outcomes)),
        flagged_envs=dict(flagged),
        outcomes=outcomes,
    )
