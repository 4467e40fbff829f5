"""Audits inside training: which slots of a play group are scripted, and what a scripted
play's outcome does to its environment.

In every group a random share of the no-hint slots (``audit.share``, at least
``audit.min_per_group``) is a scripted play (``envs/audit.py``): the environment's own
``solution()`` actions, or garbage drawn from the policy's recorded replies to OTHER
environments. The kinds alternate per environment (the first drawn at random), so an
environment meets both within its first two groups; one kind that cannot run (a free-text
solution, no replies to other environments yet) gives way to the other.

An environment whose solution play does not win, whose garbage play wins, or that crashes
or hangs under an audit, is quarantined: a memory status (``EnvRecord.quarantine`` with
the reason and step; it survives resume, ``spade memory ls`` shows it), out of the sampling
pool and the agent's play for good. Its episodes not yet trained are dropped at the
consumer (``drop_quarantined``, counted), and its designer sample scores the
invalid-environment reward (0) if its window is still open (``design.score_designs``).
Scripted plays never reach the trainer and never call the engine.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING

import anyio

from spade_async.envs.audit import (
    AuditConfig,
    Pace,
    ScriptedResult,
    pick_garbage,
    scripted_play,
    solution_for,
)

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime
    from spade_async.roles.agent import EnvRef, Episode

__all__ = ["Auditor", "auditor", "drop_quarantined", "is_quarantined", "plan_slots"]

REASONS = ("solution_lost", "garbage_won", "audit_fault")
KINDS = ("solution", "garbage")
NEW_GROUPS = 2  # an environment's first groups carry both kinds (caught within 2 steps)


def audit_config(rt: Runtime) -> AuditConfig:
    return getattr(rt.cfg, "audit", None) or AuditConfig()


def plan_slots(rng: random.Random, n: int, share: float, minimum: int) -> list[int]:
    """Which of ``n`` slots are scripted: ``share * n`` rounded at random (its fraction is
    the chance of one more), at least ``minimum`` when there are 2 slots or more, never all
    (a group keeps a real play to pace them); positions drawn at random."""
    if n < 2 or share <= 0:
        return []
    x = share * n
    k = int(x) + (rng.random() < x - int(x))
    k = min(n - 1, max(minimum, k))
    return sorted(rng.sample(range(n), k))


class Auditor:
    """The run's audit state: recorded replies per environment, each environment's next
    audit kind, the quarantined environments (mirrored from memory), the turn-gap EMA."""

    def __init__(self, cfg: AuditConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.replies: dict[str, deque[str]] = {}
        self.next_kind: dict[str, str] = {}
        self.groups: dict[str, int] = {}  # groups planned per environment
        self.quarantined: dict[str, str] = {}
        self.gap_s = cfg.default_gap_s

    # --- the garbage bank ---------------------------------------------------------------
    def record(self, ep: Episode, pace: Pace | None = None) -> None:
        """A real play's replies (the actions ``step()`` received) join the bank; its turn
        times (``pace``) move the default gap."""
        if pace is not None and len(pace.ticks) >= 2:
            self.gap_s = 0.8 * self.gap_s + 0.2 * pace.mean_gap(self.gap_s)
        if not ep.actions:
            return
        bank = self.replies.setdefault(ep.env_id, deque(maxlen=max(1, self.cfg.garbage_replies)))
        bank.extend(ep.actions)

    def garbage_pool(self, env_id: str) -> list[str]:
        own = set(self.replies.get(env_id, ()))
        return sorted({a for e, b in self.replies.items() if e != env_id for a in b} - own)

    # --- kinds --------------------------------------------------------------------------
    def kinds_for(self, env_id: str, k: int) -> list[str]:
        """The kinds of an environment's ``k`` scripted slots in its next group: both kinds
        in each of its first ``NEW_GROUPS`` groups, then alternating (first one random)."""
        seen = self.groups.get(env_id, 0)
        self.groups[env_id] = seen + 1
        if seen < NEW_GROUPS and k >= 2:
            kinds = ["solution", "garbage"] + [self.rng.choice(KINDS) for _ in range(k - 2)]
            self.rng.shuffle(kinds)
            return kinds
        out = []
        for _ in range(k):
            kind = self.next_kind.get(env_id) or self.rng.choice(KINDS)
            self.next_kind[env_id] = "garbage" if kind == "solution" else "solution"
            out.append(kind)
        return out


def auditor(rt: Runtime) -> Auditor:
    """The runtime's auditor (made on first use; quarantines live in memory)."""
    aud = getattr(rt, "_auditor", None)
    if aud is None:
        aud = Auditor(audit_config(rt), int(getattr(rt.cfg, "seed", 0)) * 7919 + 17)
        rt._auditor = aud  # type: ignore[attr-defined]
    return aud


def is_quarantined(rt: Runtime, env_id: str | None) -> bool:
    if env_id is None:
        return False
    if env_id in auditor(rt).quarantined:
        return True
    store = getattr(rt, "store", None)  # (test runtimes without memory)
    rec = store.get(env_id) if store is not None else None
    return rec is not None and bool(getattr(rec, "quarantine", ""))


async def quarantine(rt: Runtime, env_id: str, reason: str, detail: str) -> None:
    aud = auditor(rt)
    if env_id in aud.quarantined:
        return
    aud.quarantined[env_id] = reason
    rt.meters.count("audit/quarantined")
    rt.meters.count(f"audit/quarantined/{reason}")
    await rt.writer.quarantine(env_id, f"{reason}: {detail}", rt.state.step)
    rt.tel.event(rt.state.step, f"environment {env_id[:12]} quarantined ({reason}): {detail}")


def drop_quarantined(rt: Runtime, episodes: list[Episode]) -> list[Episode]:
    """The episodes whose environment is not quarantined; the others are counted."""
    kept = [e for e in episodes if not is_quarantined(rt, e.env_id)]
    rt.meters.count("audit/dropped_samples", len(episodes) - len(kept))
    return kept


async def run_scripted(
    rt: Runtime, env: EnvRef, seed: int, pace: Pace, limiter: anyio.CapacityLimiter, kind: str,
    garbage: list[str], fallback=None,
) -> ScriptedResult | None:  # fmt: skip
    """One scripted slot of ``env``'s group, paced by ``pace``'s real play, and its verdict.
    ``garbage``: the replies to other environments when the group was planned (a snapshot:
    the same in a rerun of the same seed, whatever order plays finish in). None when no
    kind could run (a free-text or too long solution, no garbage yet): the slot is then
    a real play (``fallback``), not lost. Never raises for the environment."""
    aud = auditor(rt)
    rng = random.Random(f"{getattr(rt.cfg, 'seed', 0)}:{env.env_id}:{seed}")  # per slot
    cfg = rt.cfg.agent
    await pace.opened.wait()  # the paired real play holds a slot: no wait on one held here
    if is_quarantined(rt, env.env_id):
        return None
    actions: list[str] | None = None
    fetch_calls = 0
    for k in (kind, "garbage" if kind == "solution" else "solution"):
        if k == "garbage":
            actions = pick_garbage(rng, garbage, cfg.max_turns) if garbage else None
        else:
            actions, calls, fault, error = await solution_for(rt.pool, env.source, env.env_id, seed)
            fetch_calls += calls
            if fault:
                res = ScriptedResult(kind="solution", env_id=env.env_id, seed=seed, fault=fault,
                                     error=f"solution(): {error}", calls=fetch_calls)  # fmt: skip
                await judge(rt, res)
                return res
            if actions is not None and not (0 < len(actions) <= cfg.max_turns):
                actions = None  # free text, or longer than an episode: no verdict possible
        if actions:
            kind = k
            break
    if not actions:
        rt.meters.count("audit/skipped")
        if fallback is not None:
            await fallback()
        return None
    async with limiter:
        res = await scripted_play(
            rt.pool, source=env.source, env_id=env.env_id, setting=env.setting, seed=seed,
            kind=kind, actions=actions, max_turns=cfg.max_turns, pace=pace,
            threshold=cfg.success_threshold, default_gap=aud.gap_s,
        )  # fmt: skip
    res.calls += fetch_calls
    await judge(rt, res)
    return res


async def judge(rt: Runtime, res: ScriptedResult) -> None:
    m = rt.meters
    m.count("audit/env_calls", res.calls)
    if res.skipped:
        m.count("audit/skipped")
        return
    m.count("audit/run")
    m.count(f"audit/run/{res.kind}")
    if res.fault:
        reason, detail = "audit_fault", f"{res.kind} play: {res.error}"
    elif res.kind == "solution" and not res.won:
        reason = "solution_lost"
        detail = f"solution() replayed on seed {res.seed} ends with reward {res.reward:g} after {res.turns} turns"
    elif res.kind == "garbage" and res.won:
        reason = "garbage_won"
        detail = f"replies to other environments win seed {res.seed} at turn {res.turns}"
    else:
        return
    m.count("audit/failed")
    m.count(f"audit/failed/{reason}")
    await quarantine(rt, res.env_id, reason, detail)


def group_plan(
    rt: Runtime, env_id: str, n: int
) -> tuple[dict[int, Pace], dict[int, tuple[int, str, list[str]]]]:
    """For a group of ``n`` no-hint slots of ``env_id``: the paces of the real plays that
    pace a scripted one (slot -> Pace) and the scripted slots (slot -> (the real slot
    pacing it, its kind, the garbage it may draw from)). An environment's first ``NEW_GROUPS`` groups have two when
    the group has 4 slots or more (a GRPO group keeps 2 real plays)."""
    cfg, aud = audit_config(rt), auditor(rt)
    new = aud.groups.get(env_id, 0) < NEW_GROUPS and cfg.share > 0
    # two (one of each kind) in a new environment's groups that keep 2 real plays or more
    minimum = max(cfg.min_per_group, 2) if new and n >= 4 else cfg.min_per_group
    scripted = plan_slots(aud.rng, n, cfg.share, minimum)
    if not scripted:
        return {}, {}
    real = [i for i in range(n) if i not in scripted]
    kinds = aud.kinds_for(env_id, len(scripted))
    garbage = aud.garbage_pool(env_id)
    pairs = {
        i: (aud.rng.choice(real), kind, garbage) for i, kind in zip(scripted, kinds, strict=True)
    }
    paces = {j: Pace() for j, _, _ in pairs.values()}
    return paces, pairs
