"""``telemetry`` settings (a leaf: the recipe, the dashboard and the sinks read it)."""

from __future__ import annotations

from typing import Literal

import msgspec

from spade_async.config import Doc

__all__ = ["TelemetryConfig"]


class TelemetryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    dashboard: Doc(
        Literal["auto", "on", "off"],
        "live terminal dashboard: auto (when stdout is a terminal, else plain log lines), on, off",
    ) = "auto"
    refresh_hz: Doc(float, "dashboard redraws per second (a redraw costs ~15 ms of CPU)") = 2.0
    fsync: Doc(bool, "fsync metrics.jsonl after every record (durable across power loss)") = False
    tensorboard: Doc(
        bool, "also write TensorBoard scalars to RUN_DIR/tensorboard (if installed)"
    ) = False
    wandb: Doc(bool, "also log to Weights & Biases (if installed)") = False
    wandb_project: Doc(str, "Weights & Biases project name") = "spade-async"
    episodes_per_step: Doc(int, "episode transcripts saved to RUN_DIR/episodes per step") = 2
    replay_records: Doc(
        float,
        "share of agent episodes recorded for replay in RUN_DIR/episodes/records.jsonl "
        "(chosen by a hash of environment and seed); 1 = every episode, 0 = none",
    ) = 1.0

    def __post_init__(self) -> None:
        if not self.refresh_hz > 0:
            raise ValueError(f"telemetry.refresh_hz = {self.refresh_hz}: must be > 0, e.g. 4")
        if not 0.0 <= self.replay_records <= 1.0:
            raise ValueError(
                f"telemetry.replay_records = {self.replay_records}: must be in [0, 1], e.g. 1.0"
            )
        if self.episodes_per_step < 0:
            raise ValueError(
                f"telemetry.episodes_per_step = {self.episodes_per_step}: must be >= 0"
            )
