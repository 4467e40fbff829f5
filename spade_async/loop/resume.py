"""A resume's use of the episode journal (``episodes/journal.py``; docs/resume.md).

Before the schedule starts, the steps the crashed run trained after the restored checkpoint
are redone from their journaled batches, in order (trainer time only: the exact samples,
advantages and rollout log-probs, the same loss normaliser; scoring and memory are not
repeated, memory already holds them). Each redo lands on the policy version the original
step had, so every sample's staleness is what it was and the truncated importance weight
corrects it as it did. Then the finished episodes no step consumed go back to training
(``rt.requeue``), those within ``max_staleness`` of the trainer's version; the rest, and
what the journal cannot give back, are counted by reason (``resume/lost/<reason>``) and
summed up in one event line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from spade_async.episodes.journal import Trained
from spade_async.episodes.recovery import Recovery, split_by_version
from spade_async.loop import cycle

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime

REASONS = ("unfinished", "torn", "corrupt", "stale", "ahead")


async def replay_journal(rt: Runtime, stop: anyio.Event) -> None:
    """Redo the journaled steps, then queue the pending episodes (``rt.requeue``)."""
    rec: Recovery | None = getattr(rt, "recovery", None)
    if rec is None:
        return
    rt.recovery = None
    cfg, st = rt.cfg, rt.state
    lost = dict.fromkeys(REASONS, 0) | rec.lost
    redone = redone_eps = 0
    for t in rec.redo:
        if stop.is_set() or st.step >= cfg.max_steps:
            break  # not lost: still in the journal for the next resume
        redone_eps += await redo_step(rt, rec, t)
        redone += 1
    pending = [rec.episodes[j] for j in rec.pending]
    ok, stale, ahead = split_by_version(pending, st.version, cfg.max_staleness)
    for reason, eps in (("stale", stale), ("ahead", ahead)):
        if eps and rt.journal is not None:
            rt.journal.dropped(eps, reason)
        lost[reason] += len(eps)
    rt.requeue = ok
    for reason, n in lost.items():
        rt.meters.count(f"resume/lost/{reason}", n)
    rt.meters.count("resume/redone_steps", redone)
    rt.meters.count("resume/redone_episodes", redone_eps)
    rt.meters.count("resume/requeued", len(ok))
    st.inflight_lost += lost["unfinished"]
    rt.tel.event(st.step, summary(redone, redone_eps, len(ok), lost, st.version))


def summary(redone: int, redone_eps: int, requeued: int, lost: dict[str, int], version: int) -> str:
    """The resume's one line: what the journal gave back, and what it could not, by reason."""
    why = ", ".join(f"{n} {r}" for r, n in lost.items() if n) or "none"
    return (
        f"journal: {redone} step(s) redone ({redone_eps} episodes), {requeued} finished "
        f"episode(s) back in training at policy version {version}; lost: {why}"
    )


async def redo_step(rt: Runtime, rec: Recovery, t: Trained) -> int:
    """One journaled step again: its batch to the trainer, the push, the log, and the
    checkpoint when due. A step whose version no longer lines up (the crashed run restarted
    its trainer) goes through the staleness filter first. Returns its episode count."""
    from spade_async.loop.batcher import drop_stale

    cfg, st = rt.cfg, rt.state
    samples = list(t.samples)
    if t.version != st.version:
        samples, stale = drop_stale(
            samples,
            version=st.version,
            max_staleness=cfg.max_staleness,
            designer_slack=cfg.regen_interval,
        )
        rt.meters.count("resume/lost/stale_samples", stale)
    trained_at = st.version
    metrics = await cycle.train_and_push(rt, samples, pause=False, normaliser=t.normaliser)
    st.step += 1
    episodes = rec.episodes_of(t)
    dists: dict[str, list[float]] = {"regret/values": [], "win_rate/values": []}
    record = cycle.step_record(
        rt, episodes, samples, dists, metrics, 0, None, trained_at, {"resume/redo": True}
    )
    rt.tel.log(st.step, record)
    if cycle.checkpoint_due(st.step, cfg.checkpoint_every, cfg.max_steps):
        await rt.checkpoint()
    return len(episodes)


def take_requeued(rt: Runtime) -> list:
    """The episodes a resume gave back (once): the sync schedule's first step adds them."""
    out, rt.requeue = list(getattr(rt, "requeue", [])), []
    return out


def due_now(resumed: list, version: int, max_staleness: int) -> bool:
    """Whether the next resumed group (async ``Group``, oldest first) must go into the
    step the trainer takes at ``version``: one step later it would be past the bound."""
    return bool(resumed) and version + 1 - resumed[0].version > max_staleness
