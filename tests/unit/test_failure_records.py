"""Failure records and logs read defensively (issue 45): a malformed record in
``trainer-errors/`` is one line naming it, never a traceback; a log's last error line is found
however long it is, cut and escaped."""

from __future__ import annotations

import json
import os

import pytest

from spade_async import failure

GOOD = {"who": "trainer rank 0", "time": 30.0, "type": "RuntimeError", "message": "boom"}

MALFORMED = {
    "time of another type": json.dumps({**GOOD, "time": "late"}),
    "type of another type": json.dumps({**GOOD, "type": 7}),
    "frames of another type": json.dumps({**GOOD, "frames": "a.py:1"}),
    "frame of another type": json.dumps({**GOOD, "frames": [1, 2]}),
    "message an object": json.dumps({**GOOD, "message": {"a": 1}}),
    "type missing": json.dumps({k: v for k, v in GOOD.items() if k != "type"}),
    "who missing": json.dumps({k: v for k, v in GOOD.items() if k != "who"}),
    "time missing": json.dumps({k: v for k, v in GOOD.items() if k != "time"}),
    "who null": json.dumps({**GOOD, "who": None}),
    "time null": json.dumps({**GOOD, "time": None}),
    "type null": json.dumps({**GOOD, "type": None}),
    "time NaN": json.dumps({**GOOD, "time": float("nan")}),
    "time infinite": json.dumps({**GOOD, "time": 1e999}),
    "time negative": json.dumps({**GOOD, "time": -5}),
    "not JSON": '{"who": "x", "ti',
    "not UTF-8": b'{"who": "\xff\xfe"}',
    "empty": "",
    "a list": json.dumps([GOOD]),
    "a number": "12",
    "a string": '"RuntimeError"',
    "null": "null",
    "huge": json.dumps({**GOOD, "message": "x" * (failure.MAX_RECORD + 10)}),
    "huge frames": json.dumps({**GOOD, "frames": ["f"] * 10_000}),
}


def _write(path, body) -> None:
    path.write_bytes(body if isinstance(body, bytes) else body.encode())


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_record_is_named_unreadable_not_raised(tmp_path, shape):
    _write(tmp_path / "trainer rank 0-1.json", MALFORMED[shape])
    assert failure.read_record(tmp_path / "trainer rank 0-1.json") is None
    cause = failure.recorded_cause(tmp_path)
    assert cause == f"unreadable record {tmp_path / 'trainer rank 0-1.json'}", cause


@pytest.mark.parametrize("shape", ["time null", "a list", "huge"])
def test_a_good_record_beside_a_malformed_one_is_still_the_cause(tmp_path, shape):
    _write(tmp_path / "a.json", json.dumps(GOOD))
    _write(tmp_path / "b.json", MALFORMED[shape])
    assert failure.recorded_cause(tmp_path) == (
        f"trainer rank 0: RuntimeError: boom; unreadable record {tmp_path / 'b.json'}"
    )


def test_files_that_are_not_plain_records_are_unreadable_and_never_block(tmp_path):
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")  # opened for reading, a FIFO would wait for a writer
    (tmp_path / "target").write_text(json.dumps(GOOD))
    (tmp_path / "link.json").symlink_to(tmp_path / "target")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere")
    cause = failure.recorded_cause(tmp_path)
    assert cause.startswith("unreadable record ") and cause.endswith("(+3 more)"), cause
    assert "RuntimeError" not in cause  # the link is not followed


def test_a_missing_directory_has_no_cause(tmp_path):
    assert failure.recorded_cause(tmp_path / "none") is None


def test_a_record_is_shown_on_one_escaped_cut_line(tmp_path):
    rec = {**GOOD, "who": "rank\x1b]52;c;eA==\x07", "message": "a\nb\u202e" + "y" * 1500}
    _write(tmp_path / "a.json", json.dumps(rec))
    cause = failure.recorded_cause(tmp_path)
    assert "\x1b" not in cause and "\u202e" not in cause and "\n" not in cause
    assert "\\x1b]52" in cause and "\\u202e" in cause
    assert len(cause) < 2 * failure.MAX_MESSAGE + 40 and cause.endswith("...")


def test_records_written_by_record_read_back(tmp_path):
    try:
        raise ValueError("bad value")
    except ValueError as exc:
        failure.record(exc, who="trainer rank 2", directory=tmp_path)
    (path,) = tmp_path.glob("*.json")
    rec = failure.read_record(path)
    assert rec is not None and rec.type == "ValueError" and rec.pid == os.getpid()
    assert failure.recorded_cause(tmp_path).startswith("trainer rank 2: ValueError: bad value (at ")


# ---- logs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [100, 70_000, 3_000_000])
def test_the_last_error_line_is_found_however_long(tmp_path, length):
    log = tmp_path / "engine.log"
    line = "torch.OutOfMemoryError: CUDA out of memory \x1b[2J" + "z" * length
    log.write_text("INFO up\nTraceback (most recent call last):\n" + line + "\nINFO bye\n")
    cause = failure.log_cause(log)
    assert cause is not None, "a long error line reported as none"
    assert cause.startswith("torch.OutOfMemoryError: CUDA out of memory \\x1b[2J")
    assert len(cause) <= failure.MAX_MESSAGE + 10 and "\x1b" not in cause
    assert "no error line" not in failure.died("engine", 1, log)


def test_a_long_error_line_without_a_newline_before_it(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("RuntimeError: died " + "q" * 200_000)  # the whole file is one line
    assert failure.log_cause(log).startswith("RuntimeError: died qqq")


def test_a_long_line_that_is_no_error_is_not_one(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("INFO " + "RuntimeError: " * 20_000 + "\nall fine\n")
    assert failure.log_cause(log) is None
    assert failure.log_cause(log, max_scan=1 << 10) is None  # the scan limit: unknown, not a guess


def test_the_latest_error_line_wins_over_an_earlier_long_one(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("ValueError: " + "a" * 100_000 + "\nKeyError: 'late'\n")
    assert failure.log_cause(log) == "KeyError: 'late'"


def test_a_log_that_is_not_a_file_has_no_cause(tmp_path):
    os.mkfifo(tmp_path / "fifo.log")
    assert failure.log_cause(tmp_path / "fifo.log") is None
    assert failure.log_cause(tmp_path) is None


def test_error_line_reads_long_text_lines_and_escapes():
    text = "ok\nRuntimeError: " + "\x07" * 10 + "b" * 100_000 + "\n"
    said = failure.error_line(text)
    assert said.startswith("RuntimeError: \\x07") and len(said) <= failure.MAX_MESSAGE * 4


def test_a_dead_trainer_with_a_malformed_record_is_one_line_with_its_log_cause(tmp_path):
    """The controller's failure path: TrainerProcess.alive() with a record of the wrong shape
    names it and still gives the log's last error line; never a traceback."""
    from types import SimpleNamespace

    from spade_async.trainer.config import TrainerConfig
    from spade_async.trainer.launch import TrainerProcess

    proc = TrainerProcess(TrainerConfig(), "model", tmp_path / "run", nproc=1)
    proc.proc = SimpleNamespace(poll=lambda: 1)
    proc.error_dir.mkdir(parents=True)
    _write(proc.error_dir / "trainer rank 0-7.json", MALFORMED["who null"])
    proc.log_path.write_text("INFO x\nRuntimeError: " + "long " * 50_000 + "\n")
    why = proc.alive()
    assert why.startswith("trainer ranks exited with status 1: unreadable record ")
    assert "trainer rank 0-7.json; RuntimeError: long long" in why and "\n" not in why
    _write(proc.error_dir / "trainer rank 0-7.json", json.dumps(GOOD))
    assert proc.alive().startswith("trainer ranks exited with status 1: trainer rank 0: Runtime")
