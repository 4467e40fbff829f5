"""Optional metric sinks: TensorBoard and Weights & Biases, imported only when enabled.

Neither package is a dependency. ``open_sinks`` returns the sinks it could open and one
note per sink that was enabled but could not be imported (the run goes on; metrics.jsonl
has everything). Side effects: W&B starts a background process and may sync over the
network (set WANDB_MODE=offline on machines without access); TensorBoard writes event
files under RUN_DIR/tensorboard.

Only ``kind == "step"`` records reach the sinks: numbers become scalars, booleans 0/1,
lists of numbers (``regret/values``, ``win_rate/values``) histograms, strings are skipped.
"""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path
from typing import Any, Protocol

from spade_async.telemetry.config import TelemetryConfig

__all__ = ["Sink", "TensorBoardSink", "WandbSink", "open_sinks", "split_record"]

_SKIP = ("step", "time", "kind")


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def split_record(record: dict[str, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(scalars, histograms) of a step record; everything else is left out."""
    scalars: dict[str, float] = {}
    hists: dict[str, list[float]] = {}
    for key, v in record.items():
        if key in _SKIP:
            continue
        if isinstance(v, bool):
            scalars[key] = float(v)
        elif isinstance(v, (int, float)):
            scalars[key] = float(v)
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            hists[key] = [float(x) for x in v]
    return scalars, hists


class TensorBoardSink:
    """``torch.utils.tensorboard`` (needs the ``tensorboard`` package) or ``tensorboardX``."""

    def __init__(self, log_dir: Path, summary_writer_cls: Any):
        self._w = summary_writer_cls(log_dir=str(log_dir))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        scalars, hists = split_record(record)
        for key, v in scalars.items():
            self._w.add_scalar(key, v, step)
        for key, vals in hists.items():
            import numpy as np

            self._w.add_histogram(key, np.asarray(vals, dtype=np.float64), step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbSink:
    def __init__(self, wandb: Any, project: str, run_dir: Path, run_config: dict | None):
        self._wandb = wandb
        # One W&B run per run directory: a resumed run continues the same W&B run.
        id_file = run_dir / "wandb-id"
        if not id_file.exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(uuid.uuid4().hex[:16])
        self._run = wandb.init(
            project=project, dir=str(run_dir), name=run_dir.name, config=run_config or {},
            id=id_file.read_text().strip(), resume="allow",
        )  # fmt: skip

    def write(self, record: dict[str, Any]) -> None:
        scalars, hists = split_record(record)
        data: dict[str, Any] = dict(scalars)
        for key, vals in hists.items():
            data[key] = self._wandb.Histogram(vals)
        self._run.log(data, step=int(record["step"]))

    def close(self) -> None:
        self._run.finish()


def _import_first(*names: str) -> Any:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # includes torch.utils.tensorboard without tensorboard
            errors.append(f"{name}: {exc}")
    raise ImportError("; ".join(errors))


def open_sinks(
    config: TelemetryConfig, run_dir: str | Path, run_config: dict | None = None
) -> tuple[list[Sink], list[str]]:
    """The enabled sinks that could be imported, and a note for each one skipped."""
    run_dir = Path(run_dir)
    sinks: list[Sink] = []
    notes: list[str] = []
    if config.tensorboard:
        try:
            mod = _import_first("torch.utils.tensorboard", "tensorboardX")
        except ImportError:
            notes.append("telemetry.tensorboard is on but TensorBoard is not installed "
                         "(pip install tensorboard); metrics go to metrics.jsonl only")  # fmt: skip
        else:
            sinks.append(TensorBoardSink(run_dir / "tensorboard", mod.SummaryWriter))
    if config.wandb:
        try:
            wandb = importlib.import_module("wandb")
        except ImportError:
            notes.append("telemetry.wandb is on but wandb is not installed "
                         "(pip install wandb); metrics go to metrics.jsonl only")  # fmt: skip
        else:
            sinks.append(WandbSink(wandb, config.wandb_project, run_dir, run_config))
    return sinks, notes
