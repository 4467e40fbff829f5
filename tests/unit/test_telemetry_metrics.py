import io

import numpy as np
import pytest

from spade_async.config import convert
from spade_async.errors import ConfigError, UsageError
from spade_async.telemetry.metrics import (
    Meters,
    MetricsTail,
    MetricsWriter,
    Telemetry,
    TelemetryConfig,
    read_metrics,
    write_episodes,
)


def test_writer_appends_flat_records_that_read_back(tmp_path):
    with MetricsWriter(tmp_path, clock=lambda: 1000.0) as w:
        a = w.log(
            1,
            {
                "version": 1,
                "tokens_per_s/agent": np.float32(12.5),
                "regret/values": np.array([0.0, 0.25]),
            },
        )
        b = w.log(1, {"env_id": "e1", "valid": True}, kind="env")
        # flushed per record: readable before close
        assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2
    assert a == {"step": 1, "time": 1000.0, "kind": "step", "version": 1,
                 "tokens_per_s/agent": 12.5, "regret/values": [0.0, 0.25]}  # fmt: skip
    assert read_metrics(tmp_path) == [a, b]
    assert b["kind"] == "env" and b["valid"] is True


def test_reserved_key_is_rejected(tmp_path):
    with MetricsWriter(tmp_path) as w, pytest.raises(ValueError, match="'step' is reserved"):
        w.log(3, {"step": 3})


def test_read_tolerates_torn_last_line_but_not_a_corrupt_middle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(tmp_path) as w:
        w.log(1, {"x": 1})
        w.log(2, {"x": 2})
    with open(path, "ab") as f:
        f.write(b'{"step": 3, "ti')
    assert [r["x"] for r in read_metrics(path)] == [1, 2]
    path.write_bytes(b'{"step": 1}\n{garbage\n{"step": 2}\n')
    with pytest.raises(UsageError, match="line 2"):
        read_metrics(path)


def test_reopening_cuts_a_torn_tail_so_appends_stay_valid(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(tmp_path) as w:
        w.log(1, {"x": 1})
    with open(path, "ab") as f:
        f.write(b'{"step": 2, "x"')  # killed mid-line
    with MetricsWriter(tmp_path) as w:  # resumed run
        w.log(2, {"x": 2})
    assert [r["x"] for r in read_metrics(path)] == [1, 2]
    assert path.read_bytes().endswith(b"\n")


def test_missing_metrics_file_is_one_clear_error(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        read_metrics(tmp_path / "nope.jsonl")


def test_tail_returns_only_complete_new_lines_and_notices_rewrites(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2')
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read_new()] == [1]
    assert tail.read_new() == []
    with open(path, "ab") as f:
        f.write(b', "x": 5}\n')
    assert tail.read_new() == [{"step": 2, "x": 5}]
    path.write_bytes(b'{"step": 9}\n')  # rewritten: shorter than what was read
    assert tail.read_new() == [{"step": 9}] and tail.restarted


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_meters_count_overlapping_busy_time_once():
    clock = FakeClock()
    m = Meters(clock=clock)
    with m.busy("engine"):
        clock.t += 2
        with m.busy("engine"):  # a second request in flight at the same time
            clock.t += 3
        clock.t += 1
    clock.t += 4  # idle
    with m.busy("trainer"):
        clock.t += 5
    m.add_tokens("agent", 300)
    m.count("designer/stage/ok", 2)
    snap = m.snapshot()
    assert snap["time/elapsed_s"] == 15
    assert snap["busy_s/engine"] == 6 and snap["idle_s/engine"] == 9
    assert snap["busy_s/trainer"] == 5 and snap["idle_s/trainer"] == 10
    assert snap["busy_s/env_pool"] == 0 and snap["idle_s/env_pool"] == 15
    assert snap["tokens_per_s/agent"] == 20 and snap["tokens_per_s/designer"] == 0
    assert snap["designer/stage/ok"] == 2
    clock.t += 10
    m.add_tokens("agent", 50)
    assert m.snapshot()["tokens_per_s/agent"] == 5  # per interval, not cumulative


def test_meters_include_time_still_in_flight_and_survive_a_resume():
    clock = FakeClock()
    m = Meters(clock=clock)
    with m.busy("env_pool"):
        clock.t += 4
        assert m.snapshot()["busy_s/env_pool"] == 4
    m.count("staleness/dropped", 7)
    state = m.state_dict()
    clock2 = FakeClock()
    clock2.t = 5000.0
    m2 = Meters(clock=clock2)
    m2.load_state_dict(state)
    clock2.t += 6
    snap = m2.snapshot()
    assert snap["time/elapsed_s"] == 10 and snap["busy_s/env_pool"] == 4
    assert snap["idle_s/env_pool"] == 6 and snap["staleness/dropped"] == 7


def test_config_rejects_bad_values_with_the_key():
    assert convert(TelemetryConfig, {"dashboard": "off"}).dashboard == "off"
    with pytest.raises(ConfigError, match="refresh_hz"):
        convert(TelemetryConfig, {"refresh_hz": 0})
    with pytest.raises(ConfigError, match="dashboard"):
        convert(TelemetryConfig, {"dashboard": "maybe"})
    with pytest.raises(ConfigError, match="did you mean 'wandb'"):
        convert(TelemetryConfig, {"wandbb": True})


def test_write_episodes_keeps_at_most_limit(tmp_path):
    out = write_episodes(tmp_path, 7, [{"turns": i} for i in range(5)], limit=2)
    assert out.name == "step-000007.jsonl"
    assert [r["turns"] for r in read_metrics(out)] == [0, 1]
    assert write_episodes(tmp_path, 8, [{"turns": 0}], limit=0) is None


def test_telemetry_facade_writes_file_and_plain_lines_off_a_terminal(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    with Telemetry(tmp_path, TelemetryConfig(), console=Console(file=buf)) as tel:
        tel.log(1, {"version": 1, "max_steps": 4, "tokens_per_s/agent": 42.0})
        tel.event(1, "engine 0 restarted", level="warn")
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("step 1/4 v1") and "agent 42" in lines[0]
    assert lines[1] == "[warn] step 1: engine 0 restarted"
    kinds = [r["kind"] for r in read_metrics(tmp_path)]
    assert kinds == ["step", "event"]


def test_telemetry_dashboard_off_prints_nothing(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    with Telemetry(tmp_path, TelemetryConfig(dashboard="off"), console=Console(file=buf)) as tel:
        tel.log(1, {"version": 1})
    assert buf.getvalue() == "" and len(read_metrics(tmp_path)) == 1
