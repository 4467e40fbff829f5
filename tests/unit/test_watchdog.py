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


PIN_SELF = r"""
import os, subprocess, sys, threading
from spade_async import watchdog

before = os.sched_getaffinity(0)
core = min(before)
seen = {}
started, go = threading.Event(), threading.Event()

def early():  # a thread that exists before the pin must be pinned too
    started.set(); go.wait()
    seen["early"] = os.sched_getaffinity(0)

t = threading.Thread(target=early); t.start(); started.wait()
try:
    watchdog.pin_self([max(before) + 1], "placement.controller_cpus")
    sys.exit("pinned to a core it does not have")
except ValueError as e:
    assert "placement.controller_cpus" in str(e) and "\n" not in str(e), e
assert os.sched_getaffinity(0) == before  # a refused pin changes nothing
watchdog.pin_self([core])
go.set(); t.join()
assert seen["early"] == {core}, seen
assert os.sched_getaffinity(0) == {core}
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout.strip()
assert child == str([core]), child  # a plain child inherits the pin (env workers)
wrapped = watchdog.prefix() + [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
out = subprocess.run(wrapped, capture_output=True, text=True, check=True).stdout.strip()
assert out == str(sorted(before)), out  # an unpinned engine or rank gets the cores from before
own = watchdog.prefix(cpus=[core]) + [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
assert subprocess.run(own, capture_output=True, text=True, check=True).stdout.strip() == str([core])
watchdog.unpin_self()
assert os.sched_getaffinity(0) == before
assert watchdog.prefix()[-1] == "--"  # no pin left behind for later children
print("ok")
"""


def test_pin_self_pins_every_thread_and_leaves_unpinned_children_their_cores():
    """placement.controller_cpus: the controller (all its threads, and env workers it starts
    after) runs on the given cores; engines and ranks without cores of their own keep the
    controller's cores from before; a core it lacks is refused and changes nothing."""
    out = subprocess.run(
        [sys.executable, "-c", PIN_SELF], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
