"""The asynchronous schedule: generation and training overlap, with bounded staleness.

Two tasks in one task group, joined by one bounded stream of ``Group``s (all plays of one
environment at one policy snapshot):

    producer: regenerate environments (every ``regen_interval`` versions) -> hints ->
              play groups, at most ``groups_in_flight`` at once -> stream; with
              ``pipeline.regen_overlap`` the next window is designed in the background
              while the current window's environments are played again
    consumer: take a step's worth of groups -> drop stale ones -> score -> samples ->
              train step (trainer busy while the producer keeps generating) -> pause the
              engines, push weights, resume -> log -> checkpoint

Admission is by staleness, as AReaL's rollout controller admits requests: a new group
starts only while the groups started (less those dropped) are fewer than
``(trainer steps taken + 1 + max_staleness) x groups per step``, so that a group, consumed in
order, is at most ``max_staleness`` versions old when the trainer takes it; and never more
than ``groups_in_flight`` at once (memory). So the next step's groups start as soon as the
version they need exists, not when the previous step's groups are handed over: their
generation fills the engine while the previous groups wait on their environments' steps.
A group that still arrives more than ``max_staleness`` versions behind (consumed out of
order) is dropped (counted, and its slot given back); the rest are corrected by truncated
importance sampling in the loss. The pieces are the same functions the sync schedule calls
(``cycle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from spade_async.episodes.journal import note_dropped
from spade_async.episodes.recovery import by_group
from spade_async.errors import SpadeError
from spade_async.generation.client import request_priority
from spade_async.loop import cycle
from spade_async.loop.resume import due_now, take_requeued
from spade_async.roles.agent import EnvRef, Episode

if TYPE_CHECKING:
    from spade_async.loop.runtime import Runtime


@dataclass
class Group:
    env: EnvRef | None  # None: the producer had nothing to play this round
    episodes: list[Episode]

    @property
    def version(self) -> int:
        return min((e.version for e in self.episodes if e.turn_versions), default=-1)


class Admission:
    """Staleness-bounded admission of groups (see the module docstring). It counts trainer
    steps, not versions: a step whose push was refused trains no version, and counting
    versions would then starve the producer; a group it lets start too early is dropped as
    stale at the consumer, which gives its slot back."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max(0, max_staleness)
        self.started = self.dropped = self.steps = 0
        self._changed = anyio.Event()

    def allows(self, per_step: int) -> bool:
        ahead = self.steps + 1 + self.max_staleness
        return self.started - self.dropped < ahead * max(1, per_step)

    async def admit(self, per_step_of) -> int:
        """Wait until one more group may start, count it, and return the trainer step it
        is for (in admission order): its requests' priority (``engine.priority_scheduling``)."""
        while not self.allows(per_step_of()):
            await self._changed.wait()
        self.started += 1
        return (self.started - 1 - self.dropped) // max(1, per_step_of())

    def current_step(self, per_step: int) -> int:
        """The step the next group admitted will be for (requests outside groups: hints)."""
        return (self.started - self.dropped) // max(1, per_step)

    def notify(self, *, stepped: bool = False, dropped: int = 0) -> None:
        """The trainer took a step, or ``dropped`` groups were dropped as stale."""
        self.steps += int(stepped)
        self.dropped += dropped
        self._changed.set()
        self._changed = anyio.Event()


class Shared:
    """State the producer and consumer share (one event loop: no locks needed)."""

    def __init__(self, max_staleness: int = 1) -> None:
        self.window = cycle.Window()
        self.window_start = -1  # version at which the current window's environments were made
        self.envs_per_step = 1
        self.admission = Admission(max_staleness)


async def producer(
    rt: Runtime, sh: Shared, send: ObjectSendStream[Group], stop: anyio.Event
) -> None:
    cfg, pc = rt.cfg, rt.cfg.pipeline
    limiter = anyio.Semaphore(max(1, pc.groups_in_flight))
    fresh = False  # the first round of a window: hinted plays (rewards.regret_plays)
    ranked = cfg.engine.priority_scheduling  # requests carry the step they work toward

    def priority(step: int):
        return request_priority(step if ranked else None)

    # regen_overlap: the next window is designed in the background while the engines play
    # the current window's environments again (carried rounds), instead of waiting for it
    overlap = pc.regen_overlap and not cfg.deterministic  # rng order would follow timing
    pending: Regeneration | None = None
    async with send, anyio.create_task_group() as tg:
        while not stop.is_set():
            st = rt.state
            carried = False  # this round replays the current window while the next is designed
            if cfg.designer_enabled and (
                sh.window_start < 0 or st.version - sh.window_start >= cfg.regen_interval
            ):
                if overlap and sh.window_start >= 0 and st.current_envs and pending is None:
                    pending = Regeneration(st.version)
                    with priority(sh.admission.current_step(sh.envs_per_step)):
                        tg.start_soon(pending.run, rt)
                if pending is None:
                    with priority(sh.admission.current_step(sh.envs_per_step)):
                        samples = await cycle.regenerate(rt, st.version)
                    _new_window(sh, st, samples, st.version)
                    fresh = True
                elif pending.samples is not None:  # designed while the engines played on
                    _new_window(sh, st, pending.samples, st.version)
                    pending, fresh = None, True
                else:
                    carried = True
            envs = cycle.env_refs(rt, st.current_envs + await cycle.replay(rt, cfg.replay_envs))
            sh.envs_per_step = pc.groups_per_step or max(1, len(envs))
            if not envs and pending is not None:  # nothing left to carry: wait for the design
                await pending.done.wait()
                continue
            if not envs:  # nothing valid to play: an empty step (as in sync), then regenerate
                if not cfg.designer_enabled:
                    raise SpadeError(
                        "memory holds no valid environment to replay; import a pool first"
                    )
                sh.window_start = -1
                await send.send(Group(None, []))
                continue
            with priority(sh.admission.current_step(sh.envs_per_step)):
                hints = await cycle.window_hints(rt, sh.window, envs, fresh=fresh)
            fresh = False
            for env in envs:
                if carried and pending is not None and pending.samples is not None:
                    break  # the next window is ready: its groups take the rest of the round
                await limiter.acquire()
                step = await sh.admission.admit(lambda: sh.envs_per_step)
                if stop.is_set():
                    limiter.release()
                    break
                n = cycle.plays_per_env(cfg, len(envs))
                if carried:
                    rt.meters.count("pipeline/carried_groups")
                with priority(step):  # the group's task (and its plays') inherit it
                    tg.start_soon(_play_group, rt, env, hints, send.clone(), limiter, n)


class Regeneration:
    """One window's design run in the background (``pipeline.regen_overlap``) from the
    version it started at: its samples once the designer's batch is generated and
    validated. The window starts when they are installed (as a blocking regeneration's does
    when it returns)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.samples: list | None = None
        self.done = anyio.Event()

    async def run(self, rt: Runtime) -> None:
        self.samples = await cycle.regenerate(rt, self.version)
        self.done.set()


def _new_window(sh: Shared, st, samples: list, version: int) -> None:
    sh.window = cycle.Window(samples=samples)
    sh.window_start = version
    st.current_envs = [s.env_id for s in sh.window.samples if s.env_id]


async def _play_group(rt, env, hints, send: ObjectSendStream[Group], limiter, n: int) -> None:
    try:
        async with send:
            episodes = await cycle.play(rt, [env], hints, rt.state.version, n)
            await send.send(Group(env, episodes))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the consumer is gone (shutdown): the group is an in-flight loss
    finally:
        limiter.release()


async def consumer(
    rt: Runtime,
    sh: Shared,
    recv: ObjectReceiveStream[Group],
    stop: anyio.Event,
    resumed: list[Group] | None = None,
) -> None:
    """``resumed``: the groups a resume gave back (loop/resume.py), taken first."""
    cfg, st = rt.cfg, rt.state
    resumed = list(resumed or [])
    while st.step < cfg.max_steps and not stop.is_set():
        groups: list[Group] = []
        # a resumed group that would be too old for the next step is taken now
        while len(groups) < sh.envs_per_step or due_now(resumed, st.version, cfg.max_staleness):
            g = resumed.pop(0) if resumed else await recv.receive()
            if g.env is None:  # an empty round ends the step early
                break
            if st.version - g.version > cfg.max_staleness:
                rt.meters.count("staleness/dropped", sum(1 for e in g.episodes if not e.hinted))
                note_dropped(rt, g.episodes, "stale")  # never trained: out of the journal
                sh.admission.notify(dropped=1)  # its slot goes to a fresh group
                continue
            groups.append(g)
        episodes = [e for g in groups for e in g.episodes]
        window_ends = (
            sh.window_start >= 0 and st.version + 1 - sh.window_start >= cfg.regen_interval
        )
        await cycle.learn(
            rt,
            episodes,
            sh.window,
            window_ends=window_ends,
            pause=True,
            extra={
                "stream/groups/fill": recv.statistics().current_buffer_used,
                "stream/groups/capacity": cfg.pipeline.queue_groups,
                "stream/memory_writes/fill": rt.writer.depth,
                "stream/memory_writes/capacity": cfg.memory.queue_size,
            },
            # the groups the new version allows start as soon as it is on the engines
            pushed=lambda: sh.admission.notify(stepped=True),
        )


async def run_async(rt: Runtime, stop: anyio.Event) -> None:
    send, recv = anyio.create_memory_object_stream[Group](rt.cfg.pipeline.queue_groups)
    sh = Shared(rt.cfg.max_staleness)
    resumed = [Group(EnvRef(eps[0].env_id, ""), eps) for eps in by_group(take_requeued(rt))]
    sh.admission.started += len(resumed)  # they take the first steps' slots
    async with anyio.create_task_group() as tg, recv:
        tg.start_soon(producer, rt, sh, send, stop)
        await consumer(rt, sh, recv, stop, resumed)
        tg.cancel_scope.cancel()
