import os
import queue
import signal
import subprocess
import sys
import threading
import time

from spade_async.cli import main as spade_main
from spade_async.telemetry.metrics import MetricsWriter


def write_run(run_dir, steps):
    with MetricsWriter(run_dir) as w:
        for s in steps:
            w.log(s, {"version": s, "max_steps": 10, "time/elapsed_s": 2.0 * s,
                      "tokens_per_s/agent": 77.0 * s, "stream/episodes/fill": 3,
                      "stream/episodes/capacity": 8, "designer/stage/syntax": s})  # fmt: skip


def test_once_renders_current_state_and_exits_0(tmp_path, capsys):
    write_run(tmp_path, [1, 2, 3])
    assert spade_main(["dashboard", str(tmp_path), "--once", "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert "policy v3" in out and "step 3/10" in out and "231" in out and "3/8" in out
    assert "syntax" in out


def test_missing_run_dir_or_metrics_is_one_line_exit_2(tmp_path, capsys):
    assert spade_main(["dashboard", str(tmp_path / "nope"), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run directory" in err and "not found" in err
    assert spade_main(["dashboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.jsonl" in err


def test_follow_prints_new_records_until_ctrl_c(tmp_path):
    write_run(tmp_path, [1])
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spade_async.cli", "dashboard", str(tmp_path), "--refresh", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=30)
        assert first.startswith("step 1/10 v1")
        write_run(tmp_path, [2])  # appended while following
        second = lines.get(timeout=30)
        assert second.startswith("step 2/10 v2") and "agent 154" in second
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        proc.stdout.close()
