"""The dashboard's live phase-share and mismatch panels."""

import io

from rich.console import Console

from spade_async.telemetry.dashboard import Dashboard


def _rec(s: int) -> dict:
    # per 10 s step: engine busy 8 s, env pool 2 s, trainer 5 s of which 3 s train, 1 s push
    return {"step": s, "time": 1e9 + 10 * s, "kind": "step", "version": s, "max_steps": 10,
            "time/elapsed_s": 10.0 * s, "busy_s/engine": 8.0 * s, "busy_s/env_pool": 2.0 * s,
            "busy_s/trainer": 5.0 * s, "busy_s/train": 3.0 * s, "busy_s/push": 1.0 * s,
            "train/mismatch_kl": 1e-3 * s, "train/mismatch_max": 0.25 * s,
            "train/logprob_gap": 0.01}  # fmt: skip


def test_phase_and_mismatch_panels_show_the_last_interval():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    for s in (1, 2, 3):
        dash.update(_rec(s))
    dash.console.print(dash.render())
    text = dash.console.export_text()
    assert "phase shares (last interval)" in text and "train/inference mismatch" in text
    assert "gen 80% push 10" in text  # engines
    assert "env 20%" in text
    assert "train 30% push 10% other 10%" in text  # trainer
    assert "0.003" in text and "0.75" in text  # latest KL and max |d|
    assert "train/mismatch_kl" not in text  # not repeated under "other"


def test_panels_absent_without_their_metrics():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    dash.update({"step": 1, "time": 1e9, "kind": "step", "version": 1, "time/elapsed_s": 5.0})
    dash.console.print(dash.render())
    text = dash.console.export_text()
    assert "phase shares" not in text and "mismatch" not in text
