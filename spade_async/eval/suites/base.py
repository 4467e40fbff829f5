"""The suite interface: loader, prompt, extractor, scorer; single-turn play by default."""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import AsyncIterator
from typing import Any, Protocol

import anyio

from spade_async.errors import SpadeError
from spade_async.eval.metrics import suite_metrics
from spade_async.eval.types import Item, Sample, Sampling

__all__ = ["Suite", "Context", "Generator", "fresh_instance", "render_prompt_text"]

_EPISODE_IDS = itertools.count()
# one slot per worker of each pool: episodes queue here, unbounded, and never in the pool's
# own wait for a worker, whose ``capacity_wait_s`` would score a merely queued episode 0
_SLOTS: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


def episode_slots(pool: Any) -> anyio.CapacityLimiter:
    """The limiter ``fresh_instance`` holds for ``pool``: its ``max_workers`` slots."""
    slots = _SLOTS.get(pool)
    if slots is None:
        cfg = getattr(pool, "config", None)
        slots = _SLOTS[pool] = anyio.CapacityLimiter(cfg.max_workers if cfg is not None else 4)
    return slots


@contextlib.asynccontextmanager
async def fresh_instance(
    pool: Any, source: str, prefix: str, kwargs: dict | None = None, env_class: str = ""
) -> AsyncIterator[Any]:
    """An instance of ``source``, reset at seed 0, on a worker of its own that is killed
    afterwards. Nothing one episode's input does (model-written code, an answer a scorer
    evaluates) outlives it or reaches another episode's verdict, and ids are unique, so
    two equal completions never share (and then kill) one worker.

    At most ``max_workers`` episodes of one pool are inside at once (``episode_slots``): a
    suite may start hundreds together, and the ones still queued must not time out."""
    env_id = f"eval-{prefix}-{next(_EPISODE_IDS)}"
    async with episode_slots(pool):
        try:
            inst = await pool.open(source, env_id=env_id, kwargs=kwargs, env_class=env_class)
            try:
                await pool.reset(inst, seed=0)
                yield inst
            finally:
                await pool.close(inst)
        finally:
            await pool.release(env_id)


class Generator(Protocol):
    """Anything that turns chat messages into one completion (engine client, script)."""

    async def __call__(
        self,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        *,
        item: Item | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str: ...  # ``item``: for scripted engines in tests; ``tools``: function docs (BFCL)


class Context:
    """What a suite needs while playing: a generator, the checker processes, the env pool."""

    def __init__(
        self, generate: Generator, checker: Any, pool: Any, policy_version: int | None,
        package_pool: Any = None, episode_pools: dict[str, tuple[Any, Any]] | None = None,
    ):  # fmt: skip
        self.generate, self.checker, self.pool = generate, checker, pool
        self.policy_version = policy_version
        # a pool whose workers may also import the suites' ``packages`` (reasoning-gym);
        # ``pool`` stays standard library only, like the sandbox model-written code meets
        self.package_pool = package_pool
        # suites whose episodes import a library (BFCL): suite name -> (pool, episode slots)
        self.episode_pools = dict(episode_pools or {})
        # an episode (BFCL, ACEBench) holds a pool worker for its whole dialogue: episodes of
        # every suite in flight are bounded by the pool, so none waits into the pool's 'busy'
        # timeout (which would score it 0); the prewarmed workers stay free for code checks
        cfg = getattr(pool, "config", None)
        self.episode_slots = anyio.CapacityLimiter(
            max(1, cfg.max_workers - cfg.prewarm) if cfg is not None else 4
        )


def render_prompt_text(messages: list[dict[str, Any]]) -> str:
    """The prompt as saved in ``<suite>.jsonl``: the last user message (the problem)."""
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


class Suite:
    """Subclasses set ``name``, ``sampling`` (the reference's defaults) and implement ``load``
    and ``score``; multi-turn suites override ``play`` and keep the transcript."""

    name = ""
    sampling = Sampling()
    majority = True  # maj@k applies (extracted answers are comparable)
    multi_turn = False
    needs_pool = False
    packages: tuple[str, ...] = ()  # installed distributions its environment imports
    episode_packages: tuple[str, ...] = ()  # the same, in a pool of its own (long episodes)

    def load(self, limit: int) -> list[Item]:
        raise NotImplementedError

    def configure(self, options: dict[str, str]) -> None:
        """Options given as ``data`` keys ``SUITE.OPTION`` (most suites take none)."""
        raise SpadeError(f"suite {self.name} takes no options; got {', '.join(sorted(options))}")

    def metrics(self, samples: list[Sample], k: int) -> dict[str, float]:
        """avg@k, pass@k (and maj@k where answers compare); suites with sub-scores override."""
        return suite_metrics(samples, k=k, majority=self.majority)

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        raise NotImplementedError

    async def play(self, item: Item, k: int, sampling: Sampling, ctx: Context) -> Sample:
        completion = await ctx.generate(item.messages, sampling, item=item)
        extracted, score = await self.score(item, completion, ctx)
        return Sample(
            id=item.id, sample=k, prompt=render_prompt_text(item.messages), completion=completion,
            answer=item.answer, extracted=extracted, score=score,
            policy_version=ctx.policy_version,
        )  # fmt: skip
