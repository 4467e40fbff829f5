"""Engines start together: every server is launched before any has become healthy (cold
starts overlap instead of adding up)."""

from __future__ import annotations

import anyio
import pytest

from spade_async.engines import EngineConfig, running_engines
from spade_async.generation.sglang import SGLangServer


def test_engines_start_concurrently(tmp_path, monkeypatch):
    launched, everyone = [], anyio.Event()

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        launched.append(self.cfg.port)
        if len(launched) == 3:
            everyone.set()
        await everyone.wait()  # healthy only once all three are starting: sequential hangs
        task_status.started(self.url)
        await anyio.sleep_forever()

    monkeypatch.setattr(SGLangServer, "run", run)
    cfg = EngineConfig(kind="sglang", gpus=[[0], [1], [2]], base_port=31000)

    async def main():
        with anyio.fail_after(10):
            async with running_engines(cfg, "/m", tmp_path) as procs:
                return [p.url for p in procs]

    assert anyio.run(main) == [f"http://127.0.0.1:{p}" for p in (31000, 31001, 31002)]
    assert sorted(launched) == [31000, 31001, 31002]


def test_a_failed_start_stops_the_others(tmp_path, monkeypatch):
    stopped = []

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        if self.cfg.port == 31001:
            await anyio.sleep(0.05)
            raise RuntimeError("engine 1 did not start")
        try:
            task_status.started(self.url)
            await anyio.sleep_forever()
        finally:
            stopped.append(self.cfg.port)

    monkeypatch.setattr(SGLangServer, "run", run)
    cfg = EngineConfig(kind="sglang", gpus=[[0], [1], [2]], base_port=31000)

    async def main():
        async with running_engines(cfg, "/m", tmp_path):
            pytest.fail("started")

    with pytest.raises(BaseException) as err:
        anyio.run(main)
    assert "engine 1 did not start" in repr(_leaves(err.value))
    assert sorted(stopped) == [31000, 31002]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [x for e in exc.exceptions for x in _leaves(e)]
    return [exc]


def test_zero_engines_needs_external_ones():
    """engine.count = 0 is a run on engines started elsewhere; with none named it is one line."""
    import pytest

    from spade_async import recipe
    from spade_async.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.count = 0 starts no engine"):
        recipe.load(None, ["engine.count=0"])
    cfg = recipe.load(None, ["engine.count=0", 'engine.external=["http://127.0.0.1:30000"]'])
    assert cfg.engine.count == 0
