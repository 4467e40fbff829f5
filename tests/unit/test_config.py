import subprocess
import sys

import msgspec
import pytest

from spade_async.config import Doc, apply_overrides, convert, field_docs
from spade_async.errors import ConfigError


class Inner(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    lr: Doc(float, "learning rate") = 1e-6
    steps: Doc(int, "number of steps") = 4


class Outer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Doc(str, "run name") = "x"
    trainer: Doc(Inner, "trainer section") = msgspec.field(default_factory=Inner)


def test_defaults_and_override():
    cfg = convert(Outer, apply_overrides({}, ["trainer.lr=3e-4", "name=demo"]))
    assert cfg.trainer.lr == 3e-4 and cfg.name == "demo" and cfg.trainer.steps == 4


def test_unknown_key_names_full_path_and_closest():
    with pytest.raises(ConfigError) as e:
        convert(Outer, {"trainer": {"lrr": 1.0}})
    assert "'trainer.lrr'" in str(e.value) and "did you mean 'trainer.lr'" in str(e.value)


def test_wrong_type_names_path_value_and_type():
    with pytest.raises(ConfigError) as e:
        convert(Outer, {"trainer": {"steps": "many"}})
    msg = str(e.value)
    assert "trainer.steps" in msg and "'many'" in msg and "int" in msg


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides({}, ["trainer.lr"])


def test_field_docs_cover_every_leaf():
    rows = {path: doc for path, _, _, doc in field_docs(Outer)}
    assert rows == {
        "name": "run name",
        "trainer.lr": "learning rate",
        "trainer.steps": "number of steps",
    }


def test_cli_unknown_command_exit_2():
    r = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "nope"], capture_output=True, text=True
    )
    assert (
        r.returncode == 2 and "unknown command 'nope'" in r.stderr and "Traceback" not in r.stderr
    )


def test_cli_reports_a_spade_error_from_a_task_group_as_one_line(monkeypatch, capsys):
    import types

    from spade_async.cli import dispatch as cli
    from spade_async.errors import SpadeError

    def boom(argv):
        raise ExceptionGroup("tg", [ExceptionGroup("inner", [SpadeError("engine http://x died")])])

    monkeypatch.setitem(sys.modules, "fake_cmd", types.SimpleNamespace(main=boom))
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_cmd", "test"))
    assert cli.main(["fake"]) == 2
    assert capsys.readouterr().err.strip() == "spade fake: error: engine http://x died"
