"""``spade memory verify --repair`` as a recovery tool (issue 45): only real pages speak,
the newest complete write of a record is kept, the run's settings are used, scanning is
linear in the file's size. The swap and leftovers: test_memory_repair_swap.py."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import lmdb
import msgspec
import pytest

from spade_async.memory import ops, records, repair
from spade_async.memory.pages import PAGEHDR, Pages
from spade_async.memory.records import EnvRecord, Origin, encode, make_record
from spade_async.memory.store import MemoryConfig, MemoryStore

PSIZE = 4096


def rec(code: str, **kw) -> EnvRecord:
    return make_record(code, origin=Origin(kind="import"), valid=True, stage="ok",
                       skill="logic", **kw)  # fmt: skip


def code(i: int, lines: int = 6) -> str:
    body = "\n".join(f"    x{j} = state[{j}] * {i} + {j * i} - seed" for j in range(lines))
    return f"def step_{i}(state, seed):\n{body}\n    return x0 + {i}\n"


def _stored(path: Path, config=None) -> dict[str, EnvRecord]:
    with MemoryStore(path, config, readonly=True) as store:
        return {r.id: r for r in store.records()}


def _zero_metas(path: Path) -> None:
    """Damage no B-tree walk survives: both meta pages gone, only the sweep is left."""
    f = path / "data.mdb"
    data = bytearray(f.read_bytes())
    data[: 2 * PSIZE] = bytes(2 * PSIZE)
    f.write_bytes(bytes(data))


def _add_stale_index_entry(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put(b"valid", b"f" * 64, db=env.open_db(b"status", txn=txn, dupsort=True))
    env.close()


# -- a value's bytes never speak as a page ---------------------------------------------
def _leaf_image(forged: EnvRecord) -> bytes:
    """A real LMDB leaf page (from a scratch store) holding ``forged`` under its id."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        env = lmdb.open(d, max_dbs=4)
        with env.begin(write=True) as txn:
            txn.put(forged.id.encode(), encode(forged), db=env.open_db(b"records", txn=txn))
        env.close()
        data = (Path(d) / "data.mdb").read_bytes()
    key = forged.id.encode()
    for p in range(2, len(data) // PSIZE):
        page = data[p * PSIZE : (p + 1) * PSIZE]
        if struct.unpack_from("<H", page, 10)[0] == 2 and key in page:
            return page
    raise AssertionError("no leaf page in the scratch store")


MARK = b"#FORGED-PAGE-FOLLOWS#"


def _carrier_store(path: Path, real: EnvRecord, image: bytes, pad: int, total: int) -> None:
    """A store holding ``real`` and a carrier record whose code embeds ``image`` after
    ``pad`` filler bytes (its source ``total`` bytes long whatever ``pad`` is)."""
    head = b"# carrier\n" + b"#" * pad + MARK
    source = head + image + b"\n" + b"#" * (total - len(head) - len(image) - 1)
    carrier = make_record(source, origin=Origin(kind="import"), valid=True, stage="ok",
                          skill="logic")  # fmt: skip
    with MemoryStore(path) as store:
        store.put(real)
        store.put(carrier)


def _forged_store(path: Path, real: EnvRecord, forged: EnvRecord) -> int:
    """A store where a carrier's value holds, at a page boundary of the file, a leaf page
    naming its own page number and holding ``forged``; returns that page number."""
    image, total, pad = bytearray(_leaf_image(forged)), 6 * PSIZE, 0
    for _ in range(3):  # place it on a page boundary, then give it its page number
        shutil.rmtree(path, ignore_errors=True)
        _carrier_store(path, real, bytes(image), pad, total)
        data = (path / "data.mdb").read_bytes()
        at = data.index(MARK) + len(MARK)
        if at % PSIZE == 0 and struct.unpack_from("<Q", data, at)[0] == at // PSIZE:
            return at // PSIZE
        pad += (-at) % PSIZE
        struct.pack_into("<Q", image, 0, (at + (-at) % PSIZE) // PSIZE)
    raise AssertionError("the forged page could not be aligned")


@pytest.fixture
def forged_run(tmp_path):
    real = rec(code(1))
    forged = msgspec.structs.replace(real, source=b"import os  # forged\n", valid=False,
                                     stage="forged", updated_at=4.0e9)  # fmt: skip
    path = tmp_path / "run" / "memory.lmdb"
    page = _forged_store(path, real, forged)
    before = _stored(path)
    data = (path / "data.mdb").read_bytes()
    assert Pages(data).nodes(page) is not None  # a page whose structure holds, in a value
    return path, real.id, before


def test_a_page_image_inside_a_value_forges_nothing(forged_run):
    path, rid, before = forged_run
    assert repair.scan(path) == before  # the B-tree from the meta pages
    _zero_metas(path)
    assert repair.scan(path) == before  # the sweep alone
    repair.repair(path)
    after = _stored(path)
    assert after == before
    assert after[rid].code == before[rid].code and after[rid].status == "valid"


# -- the newest complete write wins ----------------------------------------------------
def test_equal_timestamps_keep_the_later_update(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "now", lambda: 1000.0)  # every write in the same tick
    path = tmp_path / "run" / "memory.lmdb"
    ids = []
    with MemoryStore(path) as store:
        for i in range(4):
            ids.append(store.put(rec(code(i, lines=60))).id)  # overflow values
        for n in range(12):
            for rid in ids:
                store.update_stats(rid, plays_nohint=1, wins_nohint=n % 2)
    before = _stored(path)
    assert {r.updated_at for r in before.values()} == {1000.0}
    _zero_metas(path)
    got = repair.scan(path)
    assert got == before, {k: (got[k].stats.plays_nohint, v.stats.plays_nohint)
                           for k, v in before.items() if got.get(k) != v}  # fmt: skip


def test_the_rank_of_copies():
    a = rec(code(1))
    later = msgspec.structs.replace(a, stats=msgspec.structs.replace(a.stats, plays_hint=1))
    near = msgspec.structs.replace(a, near_copies=1)  # no new updated_at (ops._put)
    for newer in (later, near):
        assert repair.rank(newer, encode(newer), False) > repair.rank(a, encode(a), False)
    nan = msgspec.structs.replace(a, updated_at=float("nan"))
    inf = msgspec.structs.replace(a, updated_at=float("inf"))
    for bad in (nan, inf):  # a time that is not finite never wins
        assert repair.rank(bad, encode(bad), False) < repair.rank(a, encode(a), False)
    forged = msgspec.structs.replace(a, updated_at=9e9, exact_repeats=99)
    assert repair.rank(a, encode(a), True) > repair.rank(forged, encode(forged), False)


# -- the run's settings ----------------------------------------------------------------
def _near_answers(path: Path, cfg: MemoryConfig, probes: list[EnvRecord], tmp: Path):
    copy = tmp / "probe.lmdb"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("lock.mdb"))
    with MemoryStore(copy, cfg) as store:
        return [(r.outcome, r.duplicate_of) for r in (store.put(p) for p in probes)]


def test_repair_uses_the_runs_memory_settings(tmp_path, capsys):
    from spade_async.cli import main as spade

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[memory]\nnum_perm = 128\nnear_dup_threshold = 0.6\n")
    cfg = MemoryConfig(num_perm=128, near_dup_threshold=0.6)
    with MemoryStore(run / "memory.lmdb", cfg) as store:
        for i in range(6):
            store.put(rec(code(i, lines=12)))
    probes = [rec(code(i, lines=12) + f"# variant\nVARIANT = {i}\n") for i in range(6)]
    probes += [rec(code(100 + i, lines=3)) for i in range(2)]
    want = _near_answers(run / "memory.lmdb", cfg, probes, tmp_path)
    assert sum(o == "near_duplicate" for o, _ in want) >= 3  # the question has answers
    _add_stale_index_entry(run / "memory.lmdb")
    assert spade(["memory", "verify", str(run), "--repair"]) == 0
    capsys.readouterr()
    with MemoryStore(run / "memory.lmdb", cfg) as store:
        assert store.check_consistency() == []
    assert _near_answers(run / "memory.lmdb", cfg, probes, tmp_path) == want


def test_a_bad_memory_setting_is_refused_before_repairing(tmp_path):
    from spade_async.errors import ConfigError

    run = tmp_path / "run"
    with MemoryStore(run / "memory.lmdb") as store:
        store.put(rec(code(1)))
    (run / "config.toml").write_text('[memory]\nnum_perm = "many"\n')
    data = (run / "memory.lmdb" / "data.mdb").read_bytes()
    with pytest.raises(ConfigError, match="num_perm"):
        repair.repair(run / "memory.lmdb")
    assert (run / "memory.lmdb" / "data.mdb").read_bytes() == data


# -- linear time -----------------------------------------------------------------------
class _Counting:
    """records._decoder, counting the bytes handed to it; past ``budget``, it stops."""

    def __init__(self, inner, budget: int):
        self.inner, self.budget, self.seen = inner, budget, 0

    def decode(self, data):
        self.seen += len(data)
        if self.seen > self.budget:
            raise OverflowError(f"{self.seen} bytes decoded")
        return self.inner.decode(data)


def _crafted_pages(target: int, size: int, n: int) -> bytes:
    """``n`` real-looking leaf pages (page numbers from 0: placed at the file's start)
    whose every node names the overflow run at ``target`` holding ``size`` bytes."""
    out = bytearray()
    key = b"a" * 64
    node = struct.pack("<HHHH", size & 0xFFFF, size >> 16, 1, len(key)) + key
    node += struct.pack("<Q", target)
    per = (PSIZE - 16) // (len(node) + 2)
    for p in range(n):
        page = bytearray(PSIZE)
        upper = PSIZE - per * len(node)
        struct.pack_into("<QHHHH", page, 0, p, 0, 2, 16 + 2 * per, upper)
        for i in range(per):
            struct.pack_into("<H", page, 16 + 2 * i, upper + i * len(node))
            page[upper + i * len(node) : upper + (i + 1) * len(node)] = node
        out += page
    return bytes(out)


def test_crafted_values_keep_plain_verify_linear(tmp_path, monkeypatch):
    """A record whose code is 1 MB of leaf pages, each node naming the record's own run:
    read as pages, each node would decode the whole run (quadratic)."""
    path = tmp_path / "run" / "memory.lmdb"
    with MemoryStore(path) as store:
        store.put(rec(code(1)))
    size = 256 * PSIZE  # any run: read as pages, every node slices and decodes it
    body = _crafted_pages(2, size, 256)

    def crafted(pad: int) -> EnvRecord:
        return make_record(b"X = 1\n#" + b" " * pad + b"\n" + body, origin=Origin(kind="import"),
                           valid=True, skill="x", stage="ok")  # fmt: skip

    at = PAGEHDR + encode(crafted(0)).index(body)  # the pages on page boundaries of the file
    with MemoryStore(path) as store:
        store.put(crafted(-at % PSIZE))
    data = (path / "data.mdb").read_bytes()
    assert data.count(body[:PSIZE]) and data.index(body[:PSIZE]) % PSIZE == 0
    counter = _Counting(records._decoder, budget=3 * len(data))
    monkeypatch.setattr(records, "_decoder", counter)
    report = repair.verify(path)
    assert report["damage"] is None and report["recoverable"] == 2
    assert counter.seen <= 2 * len(data), (counter.seen, len(data))
    found, pages = repair.scan_image(data)
    assert len(found) == 2 and pages.work <= 3 * len(data), (pages.work, len(data))


def test_the_sweep_reads_each_run_once_however_many_nodes_name_it():
    """Orphaned real pages (no meta, no tree): 64 leaf pages, each node naming one 1 MB
    run; the run is read once and the work stays linear in the image's size."""
    npages_run = 256
    size = npages_run * PSIZE - 16
    run = bytearray(npages_run * PSIZE)
    struct.pack_into("<QHHI", run, 0, 66, 0, 4, npages_run)
    image = bytes(2 * PSIZE) + _crafted_pages(66, size, 66)[2 * PSIZE :] + bytes(run)
    pages = Pages(image)
    list(pages.sweep())
    assert pages.rejected == 0  # the crafted pages are real by every structural check
    assert pages.work <= 2 * len(image), (pages.work, len(image))


def test_a_meta_page_that_disagrees_gives_its_tree_no_precedence(tmp_path):
    """A bit flip makes the older meta page look newest: its tree (the previous commit)
    must not override the last commit's copy found elsewhere."""
    path = tmp_path / "run" / "memory.lmdb"
    with MemoryStore(path) as store:
        rid = store.put(rec(code(1, lines=60))).id
        store.update_stats(rid, plays_nohint=1, wins_nohint=1)
    before = _stored(path)
    f = path / "data.mdb"
    data = bytearray(f.read_bytes())
    older = min((0, PSIZE), key=lambda off: struct.unpack_from("<Q", data, off + 144)[0])
    newest = struct.unpack_from("<Q", data, PSIZE - older + 144)[0]
    struct.pack_into("<Q", data, older + 144, newest + 5)
    f.write_bytes(bytes(data))
    assert repair.scan(path) == before
