"""The recorder: every control request a whole-loop test sends to a CPU engine is judged by
SGLang 0.5.23's modelled state machine (``sglang_state.py``, which the CPU engine enforces
and which ``tests/contract`` holds to SGLang's own code); each engine writes its calls to
``SPADE_ENGINE_TRACE`` and a test that got any refused fails at teardown. A test that
plants refusals on purpose is marked ``refusals_expected``."""

from __future__ import annotations

import json

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "refusals_expected: the test plants refused calls")


@pytest.fixture(autouse=True)
def engine_trace(tmp_path_factory, monkeypatch, request):
    folder = tmp_path_factory.mktemp("engine-trace")
    monkeypatch.setenv("SPADE_ENGINE_TRACE", str(folder))
    yield folder
    if request.node.get_closest_marker("refusals_expected"):
        return
    calls = [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
             for line in f.read_text().splitlines()]  # fmt: skip
    refused = [c for c in calls if not c["ok"]]
    assert not refused, (
        f"SGLang (modelled) refused {len(refused)} of {len(calls)} calls: {refused[:5]}"
    )
