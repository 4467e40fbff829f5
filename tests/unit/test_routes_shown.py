"""Routing replay's metrics reach the dashboard's mismatch panel and ``spade report``."""

import io
from types import SimpleNamespace

from rich.console import Console

from spade_async.report import data as D
from spade_async.telemetry.dashboard import Dashboard


def _rec(s: int, replay: bool) -> dict:
    return {"step": s, "time": 1e9 + s, "kind": "step", "version": s, "time/elapsed_s": 1.0 * s,
            "train/mismatch_kl": 1e-3, "train/route_mismatch": 0.0 if replay else 0.0125,
            "train/route_drift": 0.0125, "train/route_replay": float(replay)}  # fmt: skip


def test_dashboard_shows_route_mismatch_and_drift():
    dash = Dashboard(Console(record=True, width=150, file=io.StringIO()))
    for s in (1, 2):
        dash.update(_rec(s, replay=False))
    dash.console.print(dash.render())
    text = dash.console.export_text()
    assert "MoE routes ≠" in text and "router drift" in text and "0.0125" in text


def test_report_series_and_compare_keys_have_route_mismatch():
    run = SimpleNamespace(steps=[_rec(1, True), _rec(2, True)])
    got = D.mismatch(run)
    assert got["MoE routes ≠ engine's (share)"] == ([1, 2], [0.0, 0.0])
    assert got["MoE router drift (share)"][1] == [0.0125, 0.0125]
    assert D.COMPARE_KEYS["MoE route mismatch"] == "train/route_mismatch"
