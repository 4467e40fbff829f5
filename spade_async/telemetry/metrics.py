"""Metrics records: ``RUN_DIR/metrics.jsonl``, the meters the loop feeds, and one facade.

Every record is one flat JSON object per line. Keys use ``/`` namespaces. Every record has
``"step"`` (trainer steps done), ``"time"`` (unix seconds) and ``"kind"``:

kind = "step" -- one per trainer step (what the dashboard, TensorBoard and W&B plot):
  version                    int    policy version the engines serve after this step
  max_steps                  int    steps in the run (progress bar, ETA)
  time/elapsed_s             float  wall seconds since the run started (a resume continues it)
  tokens_per_s/<role>        float  rate over the interval since the previous step record;
                                    role: designer, hint, agent (generated), trainer (trained)
  busy_s/<stage>             float  CUMULATIVE seconds since the run started during which the
  idle_s/<stage>             float  stage had work in flight / had none; stage: engine, trainer,
                                    env_pool. Cumulative so a lost record loses nothing: the
                                    dashboard takes differences for the last interval.
                                    Phases (spade report, telemetry/phases.py): train and
                                    push split the trainer's busy time (train steps, weight
                                    pushes); env_pool also holds designer validation.
  stream/<name>/fill         int    items queued right now in a bounded stream ...
  stream/<name>/capacity     int    ... and its bound (a full or empty stream shows a stall)
  designer/generated         int    cumulative designer generations judged
  designer/valid             int    cumulative generations that passed every gate
  designer/stage/<stage>     int    cumulative verdict counts; stage: syntax, structure, load,
                                    reset, step, determinism, not_done_at_reset, feasibility,
                                    timeout, memory, crash, output_too_large, ok
  regret/mean                float  mean regret of the environments scored this step
  regret/values              list   raw regrets of the environments scored this step
  win_rate/values            list   raw no-hint win rates of the same environments
  regret/hist                list   optional: bin counts over [0, 1] instead of raw values
  train/mismatch_kl          float  KL(engine || trainer) of the sampled tokens before the
                                    update (k3 estimator); train/mismatch_max: max |d log p|;
                                    train/is_weight_mean, train/is_weight_sq: the uncapped
                                    importance weights' mean and mean square (their spread)
  train/route_mismatch       float  MoE: share of token x layer routes the trainer's forward
                                    used that differ from the engine's (0 with routing
                                    replay); train/route_drift: its own router's choice vs
                                    the engine's; train/route_replay: 1 when replaying;
                                    train/route_samples_missing: samples trained without
                                    routes; routes/dropped: samples whose routes misfit
  train/route_replayed_share float  MoE: token x layer routes replayed / those a trained
                                    token depends on (1.0 with replay; below 0.99 warns);
                                    train/route_free_<reason>: those routed freely, by
                                    reason (missing, misfit, partial, unset, zero,
                                    duplicate, layout; docs/routing-replay.md);
                                    train/route_samples_partial: samples with short routes;
                                    routes/stale_turns: turns trained without replay (a
                                    weight update made their rows stale)
  reward/agent_mean          float  batch mean agent reward
  reward/designer_mean       float  batch mean designer reward
  memory/size                int    environments in memory
  memory/duplicates          int    cumulative near-duplicates rejected by memory
  engine/<i>/healthy         bool   engine i answers /health
  trainer/healthy            bool   trainer ranks alive
  router/healthy             bool   engine.router: the router answers /health
  staleness/dropped          int    cumulative samples dropped for staleness
  hint/leaks                 int    cumulative hints rejected as leaking the answer
  audit/run, audit/run/<kind> int   cumulative scripted audit plays (kind: solution, garbage;
                                    loop/audits.py); audit/skipped: none could run
  audit/failed/<reason>      int    cumulative failed audits; reason: solution_lost,
                                    garbage_won, audit_fault (a crash or hang under audit)
  audit/quarantined[/<reason>] int  cumulative environments quarantined (per reason)
  audit/dropped_samples      int    cumulative untrained episodes of quarantined environments
  audit/env_calls            int    cumulative environment calls of audits (solution fetch
                                    included); their engine tokens are 0 by construction
  resume/lost/<reason>       int    cumulative finished episodes a resume could not train
                                    again: unfinished, torn, corrupt, stale, ahead
                                    (stale_samples: samples of redone steps; docs/resume.md);
                                    resume/redone_steps, resume/redone_episodes,
                                    resume/requeued, resume/requeued_trained; resume/redo:
                                    true on the row of a step redone from the journal
  (any other numeric key, e.g. loss/policy, goes to the sinks and the dashboard's "other")

kind = "env" -- one per judged environment (the dashboard's latest-environments table):
  env_id, env_class, skill, stage (verdict stage, "ok" when valid), valid (bool),
  win_rate, regret (null until the environment has been played)

kind = "event" -- a line of text worth seeing: "level" (info, warn, error), "message".

Counters are cumulative so that the loop can restore them from a checkpoint
(``Meters.state_dict``) and a dashboard started late still shows totals. A resumed run
that logs a step again (after a kill, from an earlier checkpoint) is fine: views drop the
history from that step on.

The loop's side::

    meters = Meters()
    with Telemetry(run_dir, cfg.telemetry, run_config=to_toml_dict(cfg)) as tel:
        with meters.busy("engine"): ...           # around every engine request
        meters.add_tokens("agent", n); meters.count("designer/stage/ok")
        tel.log(step, {"version": v, "max_steps": n, **meters.snapshot(), ...})
        tel.log(step, {"env_id": ..., ...}, kind="env"); tel.event(step, "engine 1 restarted")
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from spade_async.errors import UsageError
from spade_async.telemetry.config import TelemetryConfig

__all__ = [
    "TelemetryConfig",
    "MetricsWriter",
    "MetricsTail",
    "Meters",
    "Telemetry",
    "read_metrics",
    "write_episodes",
    "METRICS_FILE",
]

METRICS_FILE = "metrics.jsonl"
_RESERVED = ("step", "time", "kind")


def _enc_hook(obj: Any) -> Any:
    # numpy / torch scalars and arrays: the loop should not have to convert by hand.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"metric value {obj!r} of type {type(obj).__name__} is not JSON-encodable")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.json.Decoder(dict)


class MetricsWriter:
    """Appends records to ``RUN_DIR/metrics.jsonl``, one line each, flushed per record."""

    def __init__(
        self, run_dir: str | Path, config: TelemetryConfig | None = None, *, clock=time.time
    ):
        self.config = config or TelemetryConfig()
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._clock = clock
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by close()

    def log(self, step: int, values: dict[str, Any], *, kind: str = "step") -> dict[str, Any]:
        clash = [k for k in _RESERVED if k in values]
        if clash:
            raise ValueError(f"metric key {clash[0]!r} is reserved; pass it as log()'s argument")
        record = {"step": int(step), "time": round(self._clock(), 3), "kind": kind, **values}
        line = _encoder.encode(record) + b"\n"
        # Round-trip so readers of the returned dict see exactly what was written to disk.
        record = _decoder.decode(line)
        self._file.write(line)
        self._file.flush()
        if self.config.fsync:
            os.fsync(self._file.fileno())
        return record

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """After a kill mid-write the file may end without a newline: cut the torn line off,
    otherwise the next append would glue a good record onto it. A last line that is a whole
    record (only its newline missing) is kept: the newline is added."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            step = min(4096, pos)
            f.seek(pos - step)
            cut = f.read(step).rfind(b"\n")
            if cut >= 0:
                break
            pos -= step
        start = pos - step + cut + 1 if pos > 0 else 0
        f.seek(start)
        try:
            whole = isinstance(_decoder.decode(f.read(size - start)), dict)
        except msgspec.DecodeError:
            whole = False
        if whole:
            f.seek(size)
            f.write(b"\n")
        else:
            f.truncate(start)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records in a metrics file. A torn last line (a writer killed mid-line, or still
    writing) is skipped; a corrupt line elsewhere is an error naming its line number."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
    if not p.is_file():
        raise UsageError(
            f"metrics file '{p}' not found; pass a run directory that has {METRICS_FILE}"
        )
    data = p.read_bytes()
    lines = data.split(b"\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(_decoder.decode(line))
        except msgspec.DecodeError:
            if i == len(lines) - 1:  # no newline after it: torn or still being written
                break
            raise UsageError(
                f"{p}: line {i + 1} is not a JSON object; the file is corrupt"
            ) from None
    return out


class MetricsTail:
    """Incremental reader for ``spade dashboard --follow``: returns only complete new lines."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.restarted = False  # set when the file shrank (rewritten): callers reset state

    def read_new(self) -> list[dict[str, Any]]:
        self.restarted = False
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial, self.restarted = 0, b"", True
        if size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        self._offset += len(chunk)
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        out = []
        for line in complete:
            if line.strip():
                with contextlib.suppress(msgspec.DecodeError):  # a line torn by a killed writer
                    out.append(_decoder.decode(line))
        return out

    def read_last_line(self) -> list[dict[str, Any]]:
        """The line after the last newline, when it is a whole record (``--once``: a run
        killed after writing a record but before its newline)."""
        try:
            rec = _decoder.decode(self._partial) if self._partial.strip() else None
        except msgspec.DecodeError:
            return []
        return [rec] if isinstance(rec, dict) else []


class Meters:
    """Busy time per stage, tokens per role and cumulative counters, for step records.

    ``with meters.busy("engine"): await client.generate(...)`` -- a stage is busy while at
    least one holder is inside (overlapping requests count once). ``snapshot()`` returns the
    ``busy_s/* idle_s/* tokens_per_s/* time/elapsed_s`` keys and every counter.
    """

    def __init__(
        self,
        stages: tuple[str, ...] = ("engine", "trainer", "env_pool", "train", "push"),
        roles: tuple[str, ...] = ("designer", "hint", "agent", "trainer"),
        *,
        clock=time.monotonic,
    ):
        self._clock = clock
        self._t0 = clock()
        self._elapsed0 = 0.0
        self._busy = dict.fromkeys(stages, 0.0)
        self._active = dict.fromkeys(stages, 0)
        self._since = dict.fromkeys(stages, 0.0)
        self._roles = tuple(roles)
        self._tokens = dict.fromkeys(roles, 0)
        self._last_snap = self._t0
        self.counters: dict[str, int] = {}

    def elapsed(self) -> float:
        return self._elapsed0 + self._clock() - self._t0

    @contextlib.contextmanager
    def busy(self, stage: str) -> Iterator[None]:
        if stage not in self._busy:
            self._busy[stage], self._active[stage], self._since[stage] = 0.0, 0, 0.0
        if self._active[stage] == 0:
            self._since[stage] = self._clock()
        self._active[stage] += 1
        try:
            yield
        finally:
            self._active[stage] -= 1
            if self._active[stage] == 0:
                self._busy[stage] += self._clock() - self._since[stage]

    def add_tokens(self, role: str, n: int) -> None:
        self._tokens[role] = self._tokens.get(role, 0) + int(n)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + int(n)

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        elapsed = self._elapsed0 + now - self._t0
        out: dict[str, Any] = {"time/elapsed_s": round(elapsed, 3)}
        for stage, busy in self._busy.items():
            if self._active[stage]:
                busy += now - self._since[stage]
            out[f"busy_s/{stage}"] = round(busy, 3)
            out[f"idle_s/{stage}"] = round(max(elapsed - busy, 0.0), 3)
        dt = max(now - self._last_snap, 1e-9)
        for role, n in self._tokens.items():
            out[f"tokens_per_s/{role}"] = round(n / dt, 2)
        self._tokens = dict.fromkeys(self._tokens, 0)
        self._last_snap = now
        out.update(self.counters)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Cumulative state for the checkpoint; busy time in flight is not carried over."""
        return {
            "elapsed_s": self.elapsed(),
            "busy_s": dict(self._busy),
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._t0 = self._last_snap = self._clock()
        self._elapsed0 = float(state["elapsed_s"])
        for stage, busy in state["busy_s"].items():
            self._busy[stage] = float(busy)
            self._active.setdefault(stage, 0)
            self._since.setdefault(stage, 0.0)
        self.counters = {k: int(v) for k, v in state["counters"].items()}


def write_episodes(
    run_dir: str | Path, step: int, transcripts: list[dict[str, Any]], limit: int
) -> Path | None:
    """Save up to ``limit`` episode transcripts to ``RUN_DIR/episodes/step-N.jsonl``."""
    if limit <= 0 or not transcripts:
        return None
    out = Path(run_dir) / "episodes" / f"step-{int(step):06d}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(_encoder.encode(t) + b"\n" for t in transcripts[:limit]))
    return out


class Telemetry:
    """What the training loop holds: ``metrics.jsonl`` + optional sinks + the terminal view.

    ``with Telemetry(run_dir, cfg) as tel: tel.log(step, values)`` -- every record goes to
    the file, then the sinks (TensorBoard / W&B, step records only), then the dashboard
    (a rich Live view, plain log lines, or nothing; see ``TelemetryConfig.dashboard``).
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: TelemetryConfig | None = None,
        *,
        console: Any = None,
        run_config: dict[str, Any] | None = None,
    ):
        from spade_async.telemetry.dashboard import make_view
        from spade_async.telemetry.sinks import open_sinks

        self.config = config or TelemetryConfig()
        self.run_dir = Path(run_dir)
        self.writer = MetricsWriter(self.run_dir, self.config)
        self.sinks, self.notes = open_sinks(self.config, self.run_dir, run_config)
        self.view = make_view(self.config, console)
        try:  # a resumed run: show the earlier history
            self.view.replay(read_metrics(self.writer.path))
        except UsageError as exc:  # a damaged file costs the history, not the run
            self.view.note(f"{exc}; the dashboard starts without history")
        for note in self.notes:
            self.view.note(note)

    def log(self, step: int, values: dict[str, Any], *, kind: str = "step") -> dict[str, Any]:
        record = self.writer.log(step, values, kind=kind)
        if kind == "step":
            for sink in self.sinks:
                sink.write(record)
        self.view.update(record)
        return record

    def event(self, step: int, message: str, level: str = "info") -> dict[str, Any]:
        return self.log(step, {"level": level, "message": message}, kind="event")

    def __enter__(self) -> Telemetry:
        self.view.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.view.stop()
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        self.writer.close()
