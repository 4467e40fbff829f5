"""The repaired store goes in with one atomic step or a journal the next open finishes
(issue 45): a kill between any two steps leaves a store that the next command opens with
every record; leftovers at the working name are removed without following links."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lmdb
import pytest

from spade_async.cli import main as spade
from spade_async.errors import ConfigError
from spade_async.memory import repair, swap
from spade_async.memory.records import Origin, make_record
from spade_async.memory.store import MemoryStore, open_checked

STEPS = ["created", "built", "journal", "aside", "exchanged", "kept", "done"]


class Killed(BaseException):
    """What a kill -9 leaves: no cleanup runs (not an Exception: nothing catches it)."""


def _stored(path: Path) -> dict:
    with MemoryStore(path, readonly=True) as store:
        return {r.id: r for r in store.records()}


@pytest.fixture
def damaged(tmp_path) -> tuple[Path, dict, bytes]:
    """A run whose store has a stale index entry (damage a repair fixes; every record
    still reads, so 'every record' is known before and after)."""
    path = tmp_path / "run" / "memory.lmdb"
    with MemoryStore(path) as store:
        for i in range(5):
            src = f"def f{i}(x):\n    return x * {i} + {i * i}\n" * (1 + 300 * (i % 2))
            store.put(make_record(src, origin=Origin(kind="import"), valid=True, stage="ok",
                                  skill="logic"))  # fmt: skip
    live = _stored(path)
    env = lmdb.open(str(path), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put(b"valid", b"f" * 64, db=env.open_db(b"status", txn=txn, dupsort=True))
    env.close()
    assert repair.verify(path)["damage"] is not None
    return path, live, (path / "data.mdb").read_bytes()


def _leftovers(path: Path) -> list[str]:
    work, journal, _ = swap.names(path)
    return [p.name for p in (work, journal) if os.path.lexists(p)]


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
@pytest.mark.parametrize("at", STEPS)
def test_a_kill_at_any_step_leaves_a_store_the_next_open_reads_whole(
    damaged, monkeypatch, capsys, at, exchange
):
    path, live, original = damaged
    monkeypatch.setattr(swap, "exchange_supported", None if exchange else False)
    reached = []

    def step(name: str) -> None:
        reached.append(name)
        if name == at:
            raise Killed(name)

    monkeypatch.setattr(swap, "step", step)
    try:
        repair.repair(path)
    except Killed:
        pass
    monkeypatch.setattr(swap, "step", lambda name: None)
    if at not in reached:  # a step of the other swap: the repair ran through
        assert _leftovers(path) == []
    pre_journal = at in ("created", "built")
    if pre_journal:  # the original, untouched; the partial build is the next repair's
        assert (path / "data.mdb").read_bytes() == original
    # the next command: a resume opens with open_checked (read-write); ls reads
    with open_checked(path, readonly=False) as store:
        assert {r.id: r for r in store.records()} == live
        if not pre_journal:
            assert store.check_consistency() == []  # the repaired store
    if pre_journal:
        assert _leftovers(path) == [path.name + swap.WORK]  # no journal: nothing moved
    else:
        assert _leftovers(path) == [] and path.is_dir() and not path.is_symlink()
        assert len(list(path.parent.glob("memory.lmdb.damaged-*"))) == 1
    assert spade(["memory", "verify", str(path.parent), "--repair"]) == 0
    capsys.readouterr()
    assert _stored(path) == live and _leftovers(path) == []
    assert spade(["memory", "verify", str(path.parent)]) == 0
    capsys.readouterr()


def test_the_fallback_between_its_renames_leaves_no_store_missing_for_long(damaged, monkeypatch):
    """Killed after memory.lmdb went aside: the next 'verify' (no store there) finishes."""
    path, live, _ = damaged
    monkeypatch.setattr(swap, "exchange_supported", False)

    def step(name):
        if name == "aside":
            raise Killed(name)

    monkeypatch.setattr(swap, "step", step)
    with pytest.raises(Killed):
        repair.repair(path)
    monkeypatch.setattr(swap, "step", lambda name: None)
    assert not path.exists()
    assert spade(["memory", "verify", str(path.parent)]) == 0
    assert _stored(path) == live and _leftovers(path) == []


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_symlink_at_the_working_name_is_removed_never_followed(damaged, tmp_path):
    path, live, _ = damaged
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("must stay")
    (victim / "data.mdb").write_bytes(b"not a store")
    before = _tree(victim)
    work = swap.names(path)[0]
    work.symlink_to(victim, target_is_directory=True)
    repair.repair(path)
    assert _tree(victim) == before
    assert _stored(path) == live and path.is_dir() and not path.is_symlink()
    assert not os.path.lexists(work)


def test_a_leftover_directory_with_a_link_inside_is_removed_without_following(damaged, tmp_path):
    path, live, _ = damaged
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("must stay")
    work = swap.names(path)[0]
    work.mkdir()
    (work / "data.mdb").symlink_to(victim / "keep.txt")
    (work / "sub").symlink_to(victim, target_is_directory=True)
    repair.repair(path)
    assert (victim / "keep.txt").read_text() == "must stay"
    assert _stored(path) == live and not os.path.lexists(work)


def test_a_tampered_journal_is_one_line_and_moves_nothing(damaged):
    path, _, original = damaged
    journal = swap.names(path)[1]
    journal.write_text('{"kept": "../../etc", "fresh_ino": 1}')
    with pytest.raises(ConfigError, match="repair journal"):
        MemoryStore(path, readonly=True)
    assert (path / "data.mdb").read_bytes() == original


def test_without_a_journal_an_open_costs_one_lstat(damaged, monkeypatch):
    path, live, _ = damaged
    calls = []
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: calls.append(str(p)) or real(p, *a, **k))
    assert swap.finish(path) is False
    assert calls == [str(swap.names(path)[1])]


def test_remove_never_follows(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "f").write_text("x")
    link = tmp_path / "l"
    link.symlink_to(target, target_is_directory=True)
    swap.remove(link)
    assert not os.path.lexists(link) and (target / "f").read_text() == "x"
    swap.remove(tmp_path / "absent")
    shutil.rmtree(target)


CHILD = r"""
import sys, time
from spade_async.memory import swap
from spade_async.memory.repair import repair
swap.step = lambda name: time.sleep(0.05)  # room for the kill to land between the steps
print("ready", flush=True)
repair(sys.argv[1])
print("done", flush=True)
"""


def test_kill_9_anywhere_in_a_real_repair(damaged):
    """A child repairing is killed with SIGKILL at delays spread over its repair; each
    time the next open reads every record, and a second repair finishes clean."""
    import signal
    import subprocess
    import sys
    import time

    path, live, _ = damaged
    for delay in (0.0, 0.08, 0.2, 0.35):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        with open_checked(path, readonly=False) as store:
            assert {r.id: r for r in store.records()} == live, delay
        repair.repair(path)
        assert _stored(path) == live and _leftovers(path) == []


def test_a_run_path_that_is_a_file_is_still_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert swap.finish(tmp_path / "afile" / "memory.lmdb") is False
    for argv in (["memory", "ls", "--run", str(tmp_path / "afile")],
                 ["memory", "verify", str(tmp_path / "afile")]):  # fmt: skip
        assert spade(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
