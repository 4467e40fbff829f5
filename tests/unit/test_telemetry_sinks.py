import io
import sys
import types

from rich.console import Console

from spade_async.telemetry.metrics import Telemetry, TelemetryConfig, read_metrics
from spade_async.telemetry.sinks import open_sinks, split_record


def test_enabled_sinks_that_are_not_installed_are_skipped_with_a_note(tmp_path, monkeypatch):
    for name in ("wandb", "torch.utils.tensorboard", "tensorboardX"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    cfg = TelemetryConfig(tensorboard=True, wandb=True)
    sinks, notes = open_sinks(cfg, tmp_path)
    assert sinks == []
    assert (
        len(notes) == 2
        and "pip install tensorboard" in notes[0]
        and "pip install wandb" in notes[1]
    )
    buf = io.StringIO()
    with Telemetry(tmp_path, cfg, console=Console(file=buf)) as tel:
        tel.log(1, {"version": 1})
    assert "note: telemetry.tensorboard is on" in buf.getvalue()
    assert len(read_metrics(tmp_path)) == 1


def test_disabled_sinks_import_nothing(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    assert open_sinks(TelemetryConfig(), tmp_path) == ([], [])
    assert "wandb" not in sys.modules


def test_split_record_scalars_and_histograms():
    scalars, hists = split_record({"step": 1, "time": 2.0, "kind": "step", "a": 1, "ok": True,
                                   "name": "x", "regret/values": [0, 0.5], "empty": []})  # fmt: skip
    assert scalars == {"a": 1.0, "ok": 1.0}
    assert hists == {"regret/values": [0.0, 0.5]}


def fake_wandb(calls):
    mod = types.ModuleType("wandb")

    class Run:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kw):
        calls.append(("init", kw))
        return Run()

    mod.init = init
    mod.Histogram = lambda vals: ("hist", tuple(vals))
    return mod


def test_wandb_sink_logs_step_records_and_keeps_one_run_id(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(calls))
    cfg = TelemetryConfig(wandb=True, wandb_project="p", dashboard="off")
    for _ in range(2):  # a second open (a resume) reuses the W&B run id
        with Telemetry(tmp_path, cfg, run_config={"lr": 1e-6}) as tel:
            tel.log(5, {"loss/policy": 0.25, "regret/values": [0.1], "trainer/healthy": True})
            tel.log(5, {"env_id": "e1"}, kind="env")  # not a step record: not sent
    inits = [c[1] for c in calls if c[0] == "init"]
    assert inits[0]["project"] == "p" and inits[0]["config"] == {"lr": 1e-6}
    assert inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    logs = [c for c in calls if c[0] == "log"]
    assert len(logs) == 2
    assert logs[0][1] == {
        "loss/policy": 0.25,
        "trainer/healthy": 1.0,
        "regret/values": ("hist", (0.1,)),
    }
    assert logs[0][2] == 5 and calls[-1] == ("finish",)


def test_tensorboard_sink_writes_scalars(tmp_path, monkeypatch):
    written: list = []

    class SummaryWriter:
        def __init__(self, log_dir):
            written.append(("dir", log_dir))

        def add_scalar(self, key, v, step):
            written.append((key, v, step))

        def add_histogram(self, key, vals, step):
            written.append((key, list(vals), step))

        def flush(self):
            pass

        def close(self):
            written.append(("closed",))

    mod = types.ModuleType("torch.utils.tensorboard")
    mod.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", mod)
    sinks, notes = open_sinks(TelemetryConfig(tensorboard=True), tmp_path)
    assert notes == [] and len(sinks) == 1
    sinks[0].write(
        {
            "step": 3,
            "time": 0.0,
            "kind": "step",
            "tokens_per_s/agent": 9.0,
            "win_rate/values": [0.5],
        }
    )
    sinks[0].close()
    assert written[0] == ("dir", str(tmp_path / "tensorboard"))
    assert ("tokens_per_s/agent", 9.0, 3) in written and ("win_rate/values", [0.5], 3) in written
    assert written[-1] == ("closed",)
