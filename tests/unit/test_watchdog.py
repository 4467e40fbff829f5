"""The watchdog ties engines and trainer ranks to the controller's life, even after kill -9."""

import os
import subprocess
import sys
import time

from spade_async import watchdog


def test_exit_code_and_pinning_pass_through():
    cmd = watchdog.prefix(cpus=[0]) + [
        sys.executable,
        "-c",
        "import os, sys; sys.exit(3 if os.sched_getaffinity(0) == {0} else 9)",
    ]
    assert subprocess.run(cmd, timeout=30).returncode == 3


def test_tree_dies_with_the_parent(tmp_path):
    """A stand-in controller starts a watchdog'd child that itself starts a grandchild in a
    new session (as torchrun does); SIGKILL the controller: both are gone within seconds."""
    pids = tmp_path / "pids"
    grandchild = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True);"
        f"open({str(pids)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    controller = (
        "import subprocess, sys, time;"
        "from spade_async import watchdog;"
        f"subprocess.Popen(watchdog.prefix() + [sys.executable, '-c', {grandchild!r}], start_new_session=True);"
        "time.sleep(120)"
    )
    ctl = subprocess.Popen([sys.executable, "-c", controller])
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    gc = int(pids.read_text())
    ctl.kill()
    ctl.wait()
    deadline = time.monotonic() + 10
    while _alive(gc) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(gc)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    finally:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
