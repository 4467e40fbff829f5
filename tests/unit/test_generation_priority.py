"""Priority scheduling in the CPU engine, as SGLang's ``--enable-priority-scheduling``: the
waiting queue is served by priority then arrival; requests carry the priority of the task
that sends them (``request_priority``); a priority sent where it is refused is a 503."""

from __future__ import annotations

import anyio
import httpx
import pytest

from spade_async.generation.client import ClientConfig, GenerationClient, request_priority
from spade_async.generation.priority import PriorityPolicy
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.server import make_engine_app, serve_in_thread

ONE = SamplingParams(max_new_tokens=2, temperature=0.0)


def _served_order(tiny_model, policy: PriorityPolicy, priorities: list[int | None]) -> list[int]:
    """Queue one request per priority on a paused engine that decodes one at a time, in
    this order, resume, and return the indices in the order the engine finished them (its
    own order: the HTTP replies may overtake one another)."""
    app = make_engine_app(str(tiny_model), context_length=32, max_running=1, priority=policy)
    done: list[int] = []
    resolve = app.engine._resolve

    def finished(seq):
        done.append(seq.prompt_ids[-1] - 3)
        resolve(seq)

    app.engine._resolve = finished
    with serve_in_thread(app) as base:

        async def main():
            async with GenerationClient([base], ClientConfig(max_retries=0)) as client:
                await client.pause("in_place")

                async def one(i: int, p: int | None) -> None:
                    with request_priority(p):
                        await client.generate([1, 2, 3 + i], ONE)

                async with anyio.create_task_group() as tg:
                    for i, p in enumerate(priorities):
                        tg.start_soon(one, i, p)
                        with anyio.fail_after(10):  # arrival order is the list's order
                            while app.engine.load() < i + 1:
                                await anyio.sleep(0.01)
                    await client.resume()

        anyio.run(main)
    return done


PRIORITIES = [5, 1, None, 3, 1]


def test_low_values_first_serves_the_queue_by_priority_then_arrival(tiny_model):
    order = _served_order(tiny_model, PriorityPolicy(enabled=True, low_first=True), PRIORITIES)
    assert order == [1, 4, 3, 0, 2]  # 1, 1 (arrival), 3, 5, then None (served last)


def test_high_values_first_is_sglangs_default_direction(tiny_model):
    order = _served_order(tiny_model, PriorityPolicy(enabled=True), PRIORITIES)
    assert order == [0, 3, 1, 4, 2]  # 5, 3, 1, 1, None


def test_without_priority_scheduling_the_queue_is_first_come_first_served(tiny_model):
    assert _served_order(tiny_model, PriorityPolicy(), PRIORITIES) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("policy", "priority", "status"),
    [
        (PriorityPolicy(abort_when_disabled=True), 3, 503),
        (PriorityPolicy(abort_when_disabled=True), None, 200),
        (PriorityPolicy(), 3, 200),  # ignored
        (PriorityPolicy(enabled=True), 1 << 63, 400),  # outside signed 64 bits
    ],
)
def test_a_refused_priority_is_sglangs_answer(tiny_model, policy, priority, status):
    app = make_engine_app(str(tiny_model), context_length=32, priority=policy)
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
    if priority is not None:
        body["priority"] = priority
    with serve_in_thread(app) as base:
        r = httpx.post(f"{base}/generate", json=body, timeout=30)
    assert r.status_code == status, r.text
    if status == 503:
        assert "Using priority is disabled for this server" in r.text


def test_the_context_priority_reaches_the_request_and_nothing_else(tiny_model):
    """``request_priority`` marks the requests of its task tree only."""
    seen: list[int | None] = []
    app = make_engine_app(str(tiny_model), context_length=32)
    original = app.priority.resolve

    def spy(p):
        seen.append(p)
        return original(p)

    app.priority = type("Spy", (), {"resolve": staticmethod(spy)})()
    with serve_in_thread(app) as base:

        async def main():
            async with GenerationClient([base]) as client:
                with request_priority(7):
                    await client.generate([1, 2], ONE)
                await client.generate([1, 2], ONE)

        anyio.run(main)
    assert seen == [7, None]


def test_a_preempted_request_resumes_where_it_was(tiny_model):
    """One row, low values first, threshold 0: a priority-1 request arriving while a
    priority-5 one decodes takes its row; the preempted one goes back to the queue with its
    tokens and resumes from them: the same greedy tokens and log-probs (fp32; 1e-4, the
    engine's own tolerance against teacher forcing) as when it runs alone."""
    policy = PriorityPolicy(enabled=True, low_first=True, preemption_threshold=0)
    app = make_engine_app(str(tiny_model), context_length=128, max_running=1, priority=policy)
    long = SamplingParams(max_new_tokens=96, temperature=0.0, ignore_eos=True)
    done: list[int] = []
    resolve = app.engine._resolve

    def finished(seq):
        done.append(seq.priority)
        resolve(seq)

    app.engine._resolve = finished
    with serve_in_thread(app) as base:

        async def main():
            async with GenerationClient([base], ClientConfig(max_retries=0)) as client:
                out = {}

                async def one(p, ids, sampling):
                    with request_priority(p):
                        out[p] = await client.generate(ids, sampling)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, 5, [1, 2, 3], long)
                    with anyio.fail_after(10):  # paused mid-decode, then the urgent one comes
                        while not (app.engine.active and len(app.engine.active[0].output_ids) >= 2):
                            await anyio.sleep(0)
                    app.engine.pause(abort=False)
                    tg.start_soon(one, 1, [4, 5], ONE)
                    with anyio.fail_after(10):
                        while app.engine.load() < 2:
                            await anyio.sleep(0.01)
                    app.engine.resume()
                with request_priority(5):
                    alone = await client.generate([1, 2, 3], long)
                return out, alone

        out, alone = anyio.run(main)
    assert done[:2] == [1, 5] and app.engine.stats["preemptions"] == 1
    assert out[5].output_ids == alone.output_ids and len(alone.output_ids) == 96
    assert max(abs(a - b) for a, b in zip(out[5].logprobs, alone.logprobs, strict=True)) < 1e-4
