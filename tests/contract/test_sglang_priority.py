"""Priority scheduling against the pinned SGLang's own code: its waiting-queue sort
(``SchedulePolicy._sort_by_priority_and_fcfs``), its default and range check
(``TokenizerManager._set_default_priority``) and its scheduler's default or abort
(``Scheduler._set_or_validate_priority``), cut out of the wheel's files with ``ast`` and run
on stand-in requests, beside the CPU engine's ``waiting_order`` and ``PriorityPolicy``; and
the launch flags the engines get, checked against the wheel's flag list."""

from __future__ import annotations

import ast
import functools
import itertools
import random
import sys
import textwrap
import types
import zipfile
from http import HTTPStatus

import pytest

from spade_async.engines import EngineConfig, check_engine, scheduling_flags
from spade_async.generation.priority import PriorityPolicy, PriorityRefused, waiting_order
from spade_async.generation.protocol import BadRequest
from spade_async.generation.sglang_source import pinned_flags, wheel_path


@functools.cache
def _method_source(path: str, cls: str, name: str) -> str:
    with zipfile.ZipFile(wheel_path()) as z:
        source = z.read(path).decode()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return textwrap.dedent(ast.get_source_segment(source, item))
    raise AssertionError(f"{cls}.{name} is not in {path} of the pinned wheel")


def sglang_method(path: str, cls: str, name: str, namespace: dict):
    """The source of ``cls.name`` in the wheel's ``path``, executed in ``namespace``."""
    code = _method_source(path, cls, name)
    exec(compile(code, f"<{path}:{cls}.{name}>", "exec"), namespace)
    return namespace[name]


SORT = ("sglang/srt/managers/schedule_policy.py", "SchedulePolicy", "_sort_by_priority_and_fcfs")
DEFAULT = ("sglang/srt/managers/tokenizer_manager.py", "TokenizerManager", "_set_default_priority")
VALIDATE = ("sglang/srt/managers/scheduler.py", "Scheduler", "_set_or_validate_priority")


@pytest.mark.parametrize("low_first", [False, True])
def test_the_waiting_queue_is_taken_in_sglangs_order(low_first):
    sort = sglang_method(*SORT, {"List": list})
    sign = 1 if low_first else -1
    rng = random.Random(7)
    for _ in range(50):
        queue = [
            types.SimpleNamespace(
                id=i, priority=rng.choice([-3, 0, 1, 1, 2, 5, sys.maxsize, -sys.maxsize - 1]),
                time_stats=types.SimpleNamespace(wait_queue_entry_time=float(i)),
            )
            for i in range(rng.randint(1, 12))
        ]  # fmt: skip
        theirs = list(queue)
        sort(theirs, sign)
        assert [q.id for q in waiting_order(queue, sign)] == [q.id for q in theirs]


def _sglang_priority(enabled, low_first, default, abort, priority):
    """SGLang's verdict on one request: ('ok', priority the scheduler holds) or the refusal."""
    obj = types.SimpleNamespace(priority=priority)
    tm = types.SimpleNamespace(enable_priority_scheduling=enabled, default_priority_value=default)
    set_default = sglang_method(*DEFAULT, {"Union": object, "GenerateReqInput": object,
                                           "EmbeddingReqInput": object})  # fmt: skip
    try:
        set_default(tm, obj)
    except ValueError:
        return ("bad request",)
    aborted = []
    sched = types.SimpleNamespace(
        enable_priority_scheduling=enabled, schedule_low_priority_values_first=low_first,
        abort_on_priority_when_disabled=abort,
        send_abort_output=lambda out, req: aborted.append(out),
    )  # fmt: skip
    req = types.SimpleNamespace(
        priority=obj.priority,
        time_stats=types.SimpleNamespace(trace_ctx=types.SimpleNamespace(abort=lambda **k: None)),
    )
    validate = sglang_method(*VALIDATE, {
        "sys": sys, "HTTPStatus": HTTPStatus, "Req": object,
        "_make_abort_req": lambda r, finished_reason: types.SimpleNamespace(
            finished_reason=finished_reason),
    })  # fmt: skip
    if not validate(sched, req):
        reason = aborted[0].finished_reason
        assert reason["status_code"] == HTTPStatus.SERVICE_UNAVAILABLE
        return ("refused", reason["message"])
    return ("ok", req.priority if enabled else None)


def _ours(enabled, low_first, default, abort, priority):
    policy = PriorityPolicy(enabled=enabled, low_first=low_first, default=default,
                            abort_when_disabled=abort)  # fmt: skip
    try:
        held = policy.resolve(priority)
    except BadRequest:
        return ("bad request",)
    except PriorityRefused as exc:
        return ("refused", str(exc))
    return ("ok", held if enabled else None)  # off: the queue is never sorted


@pytest.mark.parametrize(
    ("enabled", "low_first", "default", "abort"),
    list(itertools.product([False, True], [False, True], [None, 7], [False, True])),
)
def test_a_requests_priority_is_resolved_as_sglang_resolves_it(enabled, low_first, default, abort):
    for priority in (None, 3, -2, 1 << 63, -(1 << 63)):
        assert _ours(enabled, low_first, default, abort, priority) == _sglang_priority(
            enabled, low_first, default, abort, priority
        ), priority


def test_the_engines_scheduling_flags_are_the_pinned_sglangs():
    cfg = EngineConfig(kind="sglang", gpus=[[0]], priority_scheduling=True,
                       max_running_requests=48)  # fmt: skip
    flags = scheduling_flags(cfg)
    assert flags == ["--max-running-requests", "48", "--enable-priority-scheduling",
                     "--schedule-low-priority-values-first",
                     "--priority-scheduling-preemption-threshold", "0"]  # fmt: skip
    assert {f for f in flags if f.startswith("--")} <= set(pinned_flags())
    check_engine(cfg)
    # extra_args that set them already win, and are not doubled
    mine = EngineConfig(kind="sglang", gpus=[[0]], priority_scheduling=True,
                        extra_args=["--enable-priority-scheduling"])  # fmt: skip
    assert scheduling_flags(mine) == ["--schedule-low-priority-values-first",
                                      "--priority-scheduling-preemption-threshold", "0"]  # fmt: skip


PREEMPT = ("sglang/srt/managers/schedule_policy.py", "PrefillAdder", "preempt_to_schedule")


class _Req(types.SimpleNamespace):
    __hash__ = object.__hash__  # SGLang keeps its requests in sets (by identity)


def _sglang_victim(running, seq, low_first: bool, threshold: int):
    """The running request SGLang's ``preempt_to_schedule`` retracts for ``seq`` when one
    row must be freed (each running request frees more than ``seq`` needs), or None."""
    schedule = types.SimpleNamespace(schedule_low_priority_values_first=low_first)
    fn = sglang_method(*PREEMPT, {"get_schedule": lambda: schedule, "CLIP_MAX_NEW_TOKENS": 4096,
                                  "Req": object})  # fmt: skip
    kept: list[list[int]] = []
    reqs = [
        _Req(
            id=i, priority=r.priority, finished=lambda: False,
            time_stats=types.SimpleNamespace(wait_queue_entry_time=float(r.arrival)),
        )
        for i, r in enumerate(running)
    ]  # fmt: skip
    adder = types.SimpleNamespace(
        running_batch=types.SimpleNamespace(
            reqs=reqs, release_req=lambda i, n: None,
            filter_batch=lambda keep_indices: kept.append(keep_indices),
        ),
        preempt_list=[], rem_total_tokens=0, priority_scheduling_preemption_threshold=threshold,
        memory_budget=types.SimpleNamespace(total_offset=0),
        _request_slot_reserve_for_req=lambda req, **k: 0,
        _get_running_request_total_token_offset=lambda req: 1 << 20,
    )  # fmt: skip
    new = types.SimpleNamespace(priority=seq.priority, full_untruncated_fill_ids=[1, 2],
                                prefix_len=0, sampling_params=types.SimpleNamespace(max_new_tokens=8))  # fmt: skip
    if not fn(adder, new):
        return None
    (gone,) = [r.id for r in adder.preempt_list]
    assert kept == [[i for i in range(len(running)) if i != gone]]
    return gone


@pytest.mark.parametrize("low_first", [False, True])
@pytest.mark.parametrize("threshold", [0, 1, 10])
def test_the_preempted_row_is_the_one_sglang_retracts(low_first, threshold):
    from spade_async.generation.priority import preemption_victim

    rng = random.Random(threshold * 2 + low_first)
    for _ in range(60):
        running = [types.SimpleNamespace(priority=rng.choice([0, 1, 2, 3, 12, 20]), arrival=i)
                   for i in rng.sample(range(40), rng.randint(1, 6))]  # fmt: skip
        seq = types.SimpleNamespace(priority=rng.choice([-5, 0, 1, 2, 15, 30]), arrival=99)
        sign = 1 if low_first else -1
        assert preemption_victim(running, seq, sign, threshold) == _sglang_victim(
            running, seq, low_first, threshold
        )
