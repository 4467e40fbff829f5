"""A simulated engine's task is timed as the engine's (``sim/engine._Timed``): all of its
CPU goes to ``SIM_CPU``, never to the controller's figure, while values, exceptions and
cancellations pass through it exactly as through a plain ``await``."""

from __future__ import annotations

import time

import anyio
import pytest

from spade_async.sim import engine
from spade_async.sim.clock import run_virtual


def _burn(ms: float) -> None:
    end = time.process_time() + ms / 1000
    while time.process_time() < end:
        pass


async def _steps(log: list, out):
    for i in range(3):
        _burn(2)
        log.append(i)
        await anyio.sleep(1)
    return out


def test_values_and_the_engines_cpu_pass_through():
    log: list = []

    async def main():
        engine.SIM_CPU[0] = 0.0
        c0 = time.process_time()
        got = await engine._Timed(_steps(log, "done"))
        return got, engine.SIM_CPU[0], time.process_time() - c0, anyio.current_time()

    got, sim, total, now = run_virtual(main)
    assert got == "done" and log == [0, 1, 2] and now == pytest.approx(3.0)
    assert 0.006 <= sim <= total  # its three 2 ms steps, counted; no more than the process's


def test_exceptions_and_cancellation_pass_through():
    seen: list = []

    async def fails():
        await anyio.sleep(1)
        raise KeyError("inner")

    async def waits_forever():
        try:
            await anyio.sleep(1e9)
        finally:
            seen.append("cleaned up")

    async def main():
        with pytest.raises(KeyError, match="inner"):
            await engine._Timed(fails())
        with anyio.move_on_after(5) as scope:  # the outer task's cancel scope reaches inside
            await engine._Timed(waits_forever())
        assert scope.cancelled_caught

        async def task():  # as SimEngine.run wraps its loop
            await engine._Timed(waits_forever())

        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
            await anyio.sleep(1)
            tg.cancel_scope.cancel()
        return anyio.current_time()

    assert run_virtual(main) == pytest.approx(7.0)
    assert seen == ["cleaned up", "cleaned up"]


def test_the_real_tokenizer_cpu_is_counted_by_the_controllers_caller(tokenizer_path):
    """``RealTokenizerInPath.cpu`` names the controller's function that asked (bench/simulate.py
    reports it per step), never the hook itself or chat.py's helpers."""
    from transformers import AutoTokenizer

    from spade_async.generation.chat import Conversation
    from spade_async.sim.parts import RealTokenizerInPath

    tok = RealTokenizerInPath(AutoTokenizer.from_pretrained(tokenizer_path))
    conv = Conversation(tok, [{"role": "user", "content": "hi"}])
    conv.add_assistant([5, 2], text="ok")
    conv.add_observation("next")
    assert RealTokenizerInPath.last is tok
    assert {"encode < __init__", "render < __init__", "encode < add_observations",
            "render < _turns_text"} <= set(tok.cpu)  # fmt: skip
    assert all(n >= 1 and s >= 0 for n, s in tok.cpu.values())
    assert not any(k.endswith(("__call__", "apply_chat_template", "encode_ids")) for k in tok.cpu)
