"""Put a repaired store in ``memory.lmdb``'s place so that a kill at any point loses nothing.

``install(path, build)`` (``spade memory verify --repair``), under an exclusive lock
(``memory.lmdb.repair-lock``, ``flock``):

1. removes what an earlier killed repair left at the working name
   (``memory.lmdb.repairing``) without following a link: a symlink is unlinked, never
   entered; a directory is removed with ``shutil.rmtree`` (which unlinks the links inside);
2. creates the working directory with ``mkdir`` (fails if anything appeared there since)
   and has ``build`` write the fresh store into it (LMDB commits fsync; the directory is
   fsynced too);
3. writes the journal ``memory.lmdb.repair-journal`` (JSON: the working name, the name the
   damaged store will keep, and the fresh directory's inode), fsynced, by rename;
4. swaps: one ``renameat2(RENAME_EXCHANGE)`` (Linux; through ctypes) exchanges the two
   directories in one atomic step, so ``memory.lmdb`` always exists; then the damaged one
   is renamed from the working name to ``memory.lmdb.damaged-<time>``. Where the exchange
   is not available (another OS, a file system without it) two renames do it:
   ``memory.lmdb`` aside, then the fresh one in;
5. removes the journal.

``finish(path)`` runs before every open of a store (``MemoryStore``, ``store.open_checked``,
``spade memory verify``; a resume included): when a journal is there it completes the
swap: the fresh store is recognised by its inode, so it is never mistaken for the
damaged one whichever step the kill came after, and never taken from a symlink. Before
step 3 the original is untouched (the next repair removes the partial build); from step 3
on the fresh store is complete and the swap is finished forward; if the fresh store is
gone the damaged one is put back. Either way ``memory.lmdb`` opens with every record
the repair found.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from spade_async.errors import ConfigError

WORK, JOURNAL, LOCK = ".repairing", ".repair-journal", ".repair-lock"
_KEPT = re.compile(r"\.damaged-[0-9]{8}-[0-9]{6}(-[0-9]{1,4})?")
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
exchange_supported: bool | None = None  # None: not tried yet; tests set False for fallback


def step(name: str) -> None:
    """A point between two steps (tests raise here to simulate a kill)."""


def names(path: Path) -> tuple[Path, Path, Path]:
    return (path.with_name(path.name + WORK), path.with_name(path.name + JOURNAL),
            path.with_name(path.name + LOCK))  # fmt: skip


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lstat(p: Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _real_dir(p: Path) -> os.stat_result | None:
    st = _lstat(p)
    return st if st is not None and stat.S_ISDIR(st.st_mode) else None


def remove(p: Path) -> None:
    """Remove ``p`` without following a link: a link or file is unlinked, a directory
    removed with its content (links inside unlinked, never entered)."""
    st = _lstat(p)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)
    else:
        os.unlink(p)


def _exchange(a: Path, b: Path) -> bool:
    """Exchange ``a`` and ``b`` atomically; False when this system cannot."""
    global exchange_supported
    if exchange_supported is False:
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        exchange_supported = False
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
            exchange_supported = False
            return False
        raise OSError(err, os.strerror(err), str(a))
    exchange_supported = True
    return True


@contextmanager
def _locked(path: Path):
    lock = names(path)[2]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _kept_name(path: Path) -> Path:
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
    kept = path.with_name(f"{path.name}.damaged-{stamp}")
    while _lstat(kept) is not None:  # repaired twice in one second, or a name planted
        n += 1
        kept = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    return kept


def _write_journal(path: Path, entry: dict) -> None:
    journal = names(path)[1]
    tmp = journal.with_name(journal.name + ".tmp")
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, journal)
    _fsync_dir(path.parent)


def _read_journal(path: Path) -> dict | None:
    journal = names(path)[1]
    st = _lstat(journal)
    if st is None:
        return None
    try:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a file")
        entry = json.loads(journal.read_text())
        ok = (isinstance(entry, dict) and isinstance(entry.get("fresh_ino"), int)
              and isinstance(entry.get("kept"), str)
              and entry["kept"].startswith(path.name)
              and _KEPT.fullmatch(entry["kept"][len(path.name):]) is not None)  # fmt: skip
        if not ok:
            raise ValueError("unexpected fields")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"the repair journal '{journal}' is unreadable ({exc}); move it away and run "
            f"'spade memory verify {path.parent} --repair' again"
        ) from None
    return entry


def _complete(path: Path, entry: dict) -> None:
    """Finish the swap the journal names (see the module's docstring); then drop it."""
    work, journal, _ = names(path)
    kept = path.with_name(entry["kept"])
    if _lstat(kept) is not None and _real_dir(path) is None and _real_dir(work) is None:
        os.rename(kept, path)  # the fresh store is gone: the damaged one goes back
    cur, fresh = _real_dir(path), _real_dir(work)
    if fresh is not None and fresh.st_ino == entry["fresh_ino"]:  # not swapped yet
        if cur is None:
            os.rename(work, path)  # killed between the two renames of the fallback
        else:
            if not _exchange(path, work):
                os.rename(path, kept)
                step("aside")
                os.rename(work, path)
            step("exchanged")
        _fsync_dir(path.parent)
        cur, fresh = _real_dir(path), _real_dir(work)
    if cur is not None and cur.st_ino == entry["fresh_ino"] and _lstat(work) is not None:
        if fresh is not None:  # the damaged store, exchanged out: kept beside
            os.rename(work, kept if _lstat(kept) is None else _kept_name(path))
        else:
            remove(work)  # something planted there: never followed
        step("kept")
        _fsync_dir(path.parent)
    remove(journal)
    _fsync_dir(path.parent)


def finish(path: str | Path) -> bool:
    """Complete a repair a kill interrupted (True when there was one). Cheap: one lstat
    when there is no journal."""
    path = Path(path)
    try:
        if _lstat(names(path)[1]) is None:
            return False
    except OSError:  # a directory this user cannot search: the open says so in its words
        return False
    try:
        with _locked(path):
            entry = _read_journal(path)
            if entry is not None:
                _complete(path, entry)
    except OSError as exc:
        raise ConfigError(
            f"a repair of '{path}' was interrupted and cannot be finished here "
            f"({exc.strerror or exc}); run 'spade memory verify {path.parent} --repair' "
            "where the run directory is writable"
        ) from None
    return True


def install(path: Path, build: Callable[[Path], None]) -> Path:
    """Build a fresh store with ``build(dir)`` and swap it in for ``path``; returns where
    the damaged store is kept."""
    work, _, _ = names(path)
    with _locked(path):
        entry = _read_journal(path)
        if entry is not None:  # an earlier repair's swap: finish it before anything else
            _complete(path, entry)
        remove(work)  # an earlier repair killed while building: never followed
        os.mkdir(work, 0o755)  # exclusive: fails if anything appeared there since
        step("created")
        build(work)
        _fsync_dir(work)
        step("built")
        entry = {"kept": _kept_name(path).name, "fresh_ino": os.lstat(work).st_ino}
        _write_journal(path, entry)
        step("journal")
        _complete(path, entry)
        step("done")
    return path.with_name(entry["kept"])


__all__ = ["finish", "install", "names", "remove", "step"]
