import io

from rich.console import Console

from spade_async.telemetry.dashboard import Dashboard, PlainLogger, bar, histogram, sparkline
from spade_async.telemetry.metrics import Telemetry, TelemetryConfig, read_metrics


def step_record(s: int, *, engine1_up: bool = True) -> dict:
    """A synthetic step record as the loop writes it: 10 s per step, stage k busy k*2 s/step."""
    rec = {"step": s, "time": 1e9 + 10 * s, "kind": "step", "version": s, "max_steps": 100,
           "time/elapsed_s": 10.0 * s, "tokens_per_s/designer": 1234.0 + s,
           "tokens_per_s/hint": 321.0, "tokens_per_s/agent": 5678.0, "tokens_per_s/trainer": 9100.0,
           "stream/episodes/fill": 7, "stream/episodes/capacity": 8,
           "stream/envs/fill": 0, "stream/envs/capacity": 4,
           "designer/generated": 10 * s, "designer/valid": 9 * s, "designer/stage/ok": 9 * s,
           "designer/stage/determinism": s, "regret/mean": 0.05 * s,
           "regret/values": [0.0, 0.1, 0.2], "win_rate/values": [0.5, 0.45, 0.9],
           "reward/agent_mean": 0.1 * s, "reward/designer_mean": 0.3, "memory/size": 40 * s,
           "memory/duplicates": s, "engine/0/healthy": True, "engine/1/healthy": engine1_up,
           "trainer/healthy": True, "staleness/dropped": 3, "hint/leaks": 1, "loss/policy": 0.5,
           "train/push_s": 0.42, "train/push_paused_s": 0.17, "trainer/restarts": 1}  # fmt: skip
    for k, stage in enumerate(("engine", "trainer", "env_pool"), start=1):
        rec[f"busy_s/{stage}"] = 2.0 * k * s
        rec[f"idle_s/{stage}"] = 10.0 * s - 2.0 * k * s
    return rec


def env_record(s: int, valid: bool) -> dict:
    return {"step": s, "time": 1e9, "kind": "env", "env_id": f"env-{s:04d}", "env_class": "FogMaze",
            "skill": "Spatial_Reasoning", "stage": "ok" if valid else "determinism", "valid": valid,
            "win_rate": 0.5 if valid else None, "regret": 0.25 if valid else None}  # fmt: skip


def feed(view, steps: int = 12) -> None:
    for s in range(1, steps + 1):
        view.update(step_record(s, engine1_up=s < 10))
        view.update(env_record(s, valid=s % 3 != 0))
    view.update(
        {"step": steps, "time": 1e9, "kind": "event", "level": "warn", "message": "engine 1 died"}
    )


def render_text(dash: Dashboard) -> str:
    dash.console.print(dash.render())
    return dash.console.export_text()


def test_dashboard_shows_every_panel_with_live_numbers():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    feed(dash)
    text = render_text(dash)
    for title in ("tokens/s", "busy (last interval)", "streams (fill / capacity)", "designer validity by gate",
                  "regret / win-rate distributions", "rewards", "memory & health", "latest environments"):  # fmt: skip
        assert title in text, title
    assert "policy v12" in text and "step 12/100" in text and "12%" in text
    assert "ETA 00:14:40" in text  # 88 steps left at 10 s each
    assert "1,246" in text and "9,100" in text  # tokens/s per role
    assert "episodes" in text and "7/8" in text and "0/4" in text  # stream fill
    assert "108/120" in text and "determinism" in text  # designer validity and a gate count
    assert "n=36" in text and "in [.4,.6]=67%" in text  # win-rate distribution over 12 steps
    assert "480" in text  # memory size
    assert "✗ DOWN" in text and "● up" in text  # engine 1 is down, others up
    assert "env-0012" in text and "env-0011" in text and "loss/policy" in text
    assert "[warn] step 12: engine 1 died" in text
    assert "0.42 s" in text and "paused 0.17 s" in text  # the weight push, generation paused
    assert "trainer restarts" in text


def test_busy_panel_shows_last_interval_and_whole_run():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    feed(dash, steps=3)
    # env_pool: busy 6 s of every 10 s step -> 60% both over the last interval and the run
    last, total = dash.state.busy_frac("env_pool")
    assert abs(last - 0.6) < 1e-9 and abs(total - 0.6) < 1e-9
    dash.update({**step_record(4), "busy_s/env_pool": 18.0 + 1.0, "idle_s/env_pool": 12.0 + 9.0})
    last, total = dash.state.busy_frac("env_pool")
    assert abs(last - 0.1) < 1e-9 and abs(total - 19 / 40) < 1e-9
    assert "10% run 48%" in render_text(dash)


def test_narrow_console_still_shows_the_numbers():
    dash = Dashboard(Console(record=True, width=90, file=io.StringIO()))
    feed(dash, steps=2)
    text = render_text(dash)
    assert "policy v2" in text and "7/8" in text and "18/20" in text


def test_empty_dashboard_waits():
    dash = Dashboard(Console(record=True, width=80, file=io.StringIO()))
    assert "waiting for metrics" in render_text(dash)


def test_resumed_run_relogging_steps_drops_the_stale_history():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    feed(dash, steps=10)
    dash.update(step_record(6))  # resumed from the step-5 checkpoint
    assert dash.state.step == 6
    assert [s for s, _ in dash.state.history["reward/agent_mean"]] == [1, 2, 3, 4, 5, 6]
    assert len(dash.state.regret) == 6 * 3


def test_text_primitives():
    assert sparkline([0, 1, 2, 3]) == "▁▃▆█" and sparkline([5, 5]) == "▄▄"
    assert histogram([0.05, 0.05, 0.95], bins=4) == "█  ▄"
    assert bar(0.5, 10).plain == "█████·····"
    assert bar(2.0, 4).plain == "████"


def test_plain_logger_one_line_per_step():
    buf = io.StringIO()
    log = PlainLogger(buf)
    feed(log, steps=10)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 11  # 10 steps + 1 event; env records are not printed
    last = lines[9]
    assert last.startswith("step 10/100 v10 00:01:40 eta 00:15:00")
    assert "agent 5,678" in last and "episodes 7/8" in last and "designer valid 90/100" in last
    assert "busy engine 20% trainer 40% env_pool 60%" in last
    assert "win 0.62" in last and "DOWN: engine 1" in last
    assert lines[10] == "[warn] step 10: engine 1 died"


def test_live_dashboard_through_the_telemetry_facade(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=150)
    with Telemetry(
        tmp_path, TelemetryConfig(dashboard="on", refresh_hz=50), console=console
    ) as tel:
        for s in range(1, 4):
            rec = step_record(s)
            tel.log(s, {k: v for k, v in rec.items() if k not in ("step", "time", "kind")})
    out = buf.getvalue()
    assert "policy v" in out and "step 3/100" in out
    assert len(read_metrics(tmp_path)) == 3


def test_resumed_telemetry_replays_history_into_the_dashboard(tmp_path):
    def values(s):
        return {k: v for k, v in step_record(s).items() if k not in ("step", "time", "kind")}

    with Telemetry(tmp_path, TelemetryConfig(dashboard="off")) as tel:
        for s in range(1, 6):
            tel.log(s, values(s))
    console = Console(record=True, width=150, file=io.StringIO())
    tel = Telemetry(tmp_path, TelemetryConfig(dashboard="on"), console=console)
    try:
        tel.log(4, values(4))  # resumed from the step-3 checkpoint
        assert [s for s, _ in tel.view.state.history["reward/agent_mean"]] == [1, 2, 3, 4]
    finally:
        tel.close()
    assert len(read_metrics(tmp_path)) == 6


def test_damaged_history_is_a_note_not_a_crash(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n{oops\n{"step": 2}\n')
    buf = io.StringIO()
    with Telemetry(tmp_path, TelemetryConfig(), console=Console(file=buf)) as tel:
        tel.log(3, {"version": 3})
    assert "line 2 is not a JSON object" in buf.getvalue() and "step 3 v3" in buf.getvalue()


def test_bad_distribution_values_are_skipped_not_fatal():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    dash.update(
        {**step_record(1), "regret/values": [float("nan"), None, 0.5, "x"], "win_rate/values": 3}
    )
    assert [v for _, v in dash.state.regret] == [0.5] and len(dash.state.win_rate) == 0
    assert "n=1" in render_text(dash)
