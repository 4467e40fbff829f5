"""Damage a run directory can suffer, through every command that reads it (issue 37).

memory.lmdb cut at 20 random offsets, bit flips, a garbled record, a tampered id; a
config.toml of the wrong type; episode records short, oversized or torn; metrics.jsonl
cut anywhere. Every command answers in one line (exit 2) or works; never a traceback or a
signal; ``spade memory verify --repair`` recovers every record written before a cut.
"""

from __future__ import annotations

import random
import shutil
import struct
import sys
from pathlib import Path

import lmdb
import pytest

sys.path.insert(0, str(Path(__file__).parent / "hostile_surfaces"))
import payloads as P  # noqa: E402

from spade_async.cli import main as spade  # noqa: E402
from spade_async.memory.records import encode  # noqa: E402
from spade_async.memory.store import MemoryStore  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "demo_run"


def _stored(path: Path) -> dict:
    with MemoryStore(path, readonly=True) as store:
        return {r.id: r for r in store.records()}


def _raw(path: Path) -> list[bytes]:
    """The records' bytes as stored (a repair copies them as found, byte for byte)."""
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=12)
    with env.begin() as txn:
        out = [raw for _, raw in txn.cursor(env.open_db(b"records", txn=txn, create=False))]
    env.close()
    return out


LIVE = _stored(FIXTURE / "memory.lmdb")
DATA = (FIXTURE / "memory.lmdb" / "data.mdb").read_bytes()


def live_ranges(data: bytes, psize: int = 4096) -> dict[str, tuple[int, int]]:
    """id -> (start, end) in the file of each record's live value: the B-tree walked from
    the newest meta page (a ground truth apart from repair.scan, which reads every page)."""
    u16 = lambda o: struct.unpack_from("<H", data, o)[0]  # noqa: E731
    u64 = lambda o: struct.unpack_from("<Q", data, o)[0]  # noqa: E731

    def nodes(pg: int):
        off = pg * psize
        for i in range((u16(off + 12) - 16) // 2):
            node = off + u16(off + 16 + 2 * i)
            lo, hi, flags, ksize = struct.unpack_from("<HHHH", data, node)
            if u16(off + 10) & 1:  # a branch page: the child's page number
                yield from nodes(lo | hi << 16 | flags << 32)
                continue
            key, size = data[node + 8 : node + 8 + ksize], lo | hi << 16
            start = u64(node + 8 + ksize) * psize + 16 if flags & 1 else node + 8 + ksize
            yield key, start, size

    meta = max((0, psize), key=lambda o: u64(o + 144))
    db = next(data[s : s + 48] for k, s, _ in nodes(u64(meta + 128)) if k == b"records")
    return {k.decode(): (s, s + n) for k, s, n in nodes(struct.unpack_from("<Q", db, 40)[0])}


RANGES = live_ranges(DATA)


@pytest.fixture
def run(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("report", "lock.mdb"))
    return dst


def _answer(argv, capsys) -> tuple[int, str, str]:
    code = spade([str(a) for a in argv])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and not P.raw_controls(cap.out + cap.err), (argv, cap.err)
    return code, cap.out, cap.err


def _one_line_2(argv, capsys, *, expect: str = "") -> str:
    code, out, err = _answer(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and not out.strip(), (argv, code, out, err)
    assert expect in err, (argv, err)
    return err


def _memory_commands(run: Path, tmp: Path) -> list[list]:
    r = ["--run", run]
    some = next(iter(LIVE))[:8]
    return [["memory", "ls", *r], ["memory", "show", some, *r], ["memory", "stats", *r],
            ["memory", "ls", *r, "--json"], ["memory", "export", tmp / "x", *r],
            ["memory", "export", tmp / "y", *r, "--format", "jsonl"],
            ["memory", "export", tmp / "z", *r, "--format", "gymnasium"],
            ["memory", "verify", run], ["episode", "replay", run, "--all"]]  # fmt: skip


CUTS = sorted(random.Random(37).sample(range(1, len(DATA)), 20))


def test_lmdb_cut_at_20_offsets_one_line_each_and_repair_recovers(run, tmp_path, capsys):
    data_mdb = run / "memory.lmdb" / "data.mdb"
    for i, cut in enumerate(CUTS):
        shutil.rmtree(run / "memory.lmdb")
        shutil.copytree(FIXTURE / "memory.lmdb", run / "memory.lmdb")
        data_mdb.write_bytes(DATA[:cut])
        for argv in _memory_commands(run, tmp_path):
            _one_line_2(argv, capsys, expect="--repair")
        if i == 0:  # the report writes its page without the memory (all 20: a slow test)
            _one_line_2(["report", run, "--out", tmp_path / "rep"], capsys, expect="--repair")
        with pytest.raises(Exception, match="damaged"):  # what a resume opens it with
            MemoryStore(run / "memory.lmdb")
        code, out, _ = _answer(["memory", "verify", run, "--repair"], capsys)
        assert code == 0 and "repaired" in out
        got = _stored(run / "memory.lmdb")
        whole = {k for k, (_, end) in RANGES.items() if end <= cut}  # written before the cut
        assert whole <= set(got), (cut, whole - set(got))
        assert all(got[k] == LIVE[k] for k in whole)  # the live version, byte for byte
        assert all(raw in DATA[:cut] for raw in _raw(run / "memory.lmdb"))  # nothing invented
        if i % 5 == 0:  # the fresh store reads whole, indexes and all
            assert _answer(["memory", "ls", "--run", run], capsys)[0] == 0
            assert MemoryStore(run / "memory.lmdb").check_consistency() == []


@pytest.mark.slow
def test_report_on_every_cut(run, tmp_path, capsys):
    for cut in CUTS:
        (run / "memory.lmdb" / "data.mdb").write_bytes(DATA[:cut])
        _one_line_2(["report", run, "--out", tmp_path / "rep"], capsys, expect="--repair")
        assert (tmp_path / "rep" / "index.html").is_file()


def test_bit_flips_never_crash_a_reader(run, tmp_path, capsys):
    rng = random.Random(3)
    for _ in range(6):
        data = bytearray(DATA)
        for _ in range(rng.choice([1, 8, 64])):
            pos = rng.randrange(0, len(data))
            data[pos] ^= 1 << rng.randrange(8)
        (run / "memory.lmdb" / "data.mdb").write_bytes(bytes(data))
        for argv in (["memory", "ls", "--run", run], ["memory", "verify", run]):
            code, out, err = _answer(argv, capsys)
            assert code == 0 or (code == 2 and err.count("\n") == 1), (argv, err)
        assert _answer(["memory", "verify", run, "--repair"], capsys)[0] == 0
        assert _answer(["memory", "ls", "--run", run], capsys)[0] == 0


def _tamper(path: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=env.open_db(b"records", txn=txn))
    env.close()


@pytest.mark.parametrize("key, value", [
    (b"0" * 64, b"\x85garbage\xff"),  # a record that does not decode
    (b"../../x", None),  # a tampered id (a path)
], ids=["garbled", "traversal"])  # fmt: skip
def test_a_bad_record_is_one_line_and_repair_keeps_the_rest(run, tmp_path, capsys, key, value):
    import msgspec

    if value is None:
        value = encode(msgspec.structs.replace(next(iter(LIVE.values())), id=key.decode()))
    _tamper(run / "memory.lmdb", key, value)
    for argv in _memory_commands(run, tmp_path):
        _one_line_2(argv, capsys, expect="--repair")
    assert not (tmp_path.parent / "x.py").exists() and not list(tmp_path.rglob("x.py"))
    assert _answer(["memory", "verify", run, "--repair"], capsys)[0] == 0
    assert _stored(run / "memory.lmdb") == LIVE
    code, out, _ = _answer(["memory", "export", tmp_path / "out", "--run", run], capsys)
    assert code == 0 and len(list((tmp_path / "out").glob("*.py"))) == len(LIVE)


@pytest.mark.parametrize("line", ['max_steps = "3"', 'regen_interval = 1.5',
                                  '[envs]\nmax_workers = "2"', 'max_steps = -3',
                                  '[envs]\nmax_workers = 0', 'shutdown_grace_s = nan'])  # fmt: skip
def test_a_config_of_the_wrong_type_is_refused_alike(run, tmp_path, capsys, line):
    cfg = run / "config.toml"
    text = cfg.read_text()
    key = line.split("=")[0].split("\n")[-1].strip()
    kept = [x for x in text.splitlines() if not x.startswith(key + " ")]
    if line.startswith("["):
        kept = [x for x in kept if x.strip() != "[envs]"]
        cfg.write_text("\n".join(kept) + "\n" + line + "\n")
    else:
        cfg.write_text(line + "\n" + "\n".join(kept) + "\n")
    errs = [_one_line_2(argv, capsys, expect=key).split("error: ", 1)[1] for argv in (
        ["report", run, "--out", tmp_path / "r"], ["episode", "replay", run, "--all"],
        ["train", "configs/cpu-demo.toml", "--run-dir", run])]  # fmt: skip
    assert len(set(errs)) == 1, errs  # the same line from every command, resume included


def test_episode_records_short_oversized_torn(run, capsys):
    path = run / "episodes" / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    good = len(lines)
    bad = [
        lines[0].replace(b'"step_rewards":[', b'"step_rewards":[1.0,'),  # one reward too many
        lines[1].replace(b'"step_rewards":[', b'"step_rewards":[]', 1)[: len(lines[1]) // 2],
        lines[2].replace(b'"id":"', b'"id":"' + b"x" * 700),  # a 700-character id
        b'{"id": ' + b"1" * (17 << 20) + b"}\n",  # oversized
        b"\x00\xff not json\n",
    ]
    path.write_bytes(b"".join(lines) + b"".join(x.rstrip(b"\n") + b"\n" for x in bad) + b'{"torn')
    code, out, err = _answer(["episode", "ls", run], capsys)
    assert code == 0 and len(out.splitlines()) == good and f"({len(bad) + 1} unreadable" in err
    code, out, err = _answer(["episode", "replay", run, "x" * 700], capsys)
    assert code == 2 and err.count("\n") == 1
    from spade_async.report.data import load_run  # the report's reading of them

    assert any("6 unreadable line(s) skipped" in m for m in load_run(run).missing)


def test_metrics_cut_anywhere_and_a_last_record_without_newline(run, tmp_path, capsys):
    from spade_async.report.data import load_run
    from spade_async.telemetry.metrics import MetricsWriter, read_metrics

    path = run / "metrics.jsonl"
    data = path.read_bytes()
    whole = read_metrics(path)
    path.write_bytes(data.rstrip(b"\n"))  # the last record whole, its newline lost
    with MetricsWriter(run):  # what a resume opens
        pass
    assert read_metrics(path) == whole and path.read_bytes() == data
    for cut in random.Random(5).sample(range(1, len(data)), 8):
        path.write_bytes(data[:cut])
        code, _, err = _answer(["dashboard", run, "--once", "--width", "120"], capsys)
        assert code == 0, (cut, err)
        load_run(run)  # what the report reads (the page itself: a slow test)
        with MetricsWriter(run):
            pass
        assert path.read_bytes() == data[
            : data.rfind(b"\n", 0, cut) + 1
        ] or path.read_bytes().endswith(b"}\n")


def test_import_skips_and_counts_odd_skills(tmp_path, capsys):
    from spade_async.envs.examples import HERE

    src = tmp_path / "src"
    src.mkdir()
    honest = (HERE / "modular_lock.py").read_text()
    for name, skill in {"empty": '""', "long": repr("x" * 700), "surrogate": '"\\ud800"',
                        "escape": '"a\\x1b]52;c;eA==\\x07"', "newline": '"a\\nb"'}.items():  # fmt: skip
        (src / f"{name}.py").write_text(f"SKILL = {skill}\n" + honest)
    (src / "ok.py").write_text("SKILL = 'Planning'\n" + honest)
    code, out, err = _answer(["memory", "import", src, "--run", tmp_path / "run",
                              "--seeds", "0"], capsys)  # fmt: skip
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("accepted 1, rejected 0, duplicate 0, skipped 5")
    _one_line_2(["memory", "import", src, "--run", tmp_path / "run", "--skill", "a\x1bb"], capsys)


def test_verify_finds_indexes_that_disagree_and_repair_rebuilds_them(run, capsys):
    env = lmdb.open(str(run / "memory.lmdb"), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put(b"valid", b"f" * 64, db=env.open_db(b"status", txn=txn, dupsort=True))
    env.close()
    _one_line_2(["memory", "verify", run], capsys, expect="index entries disagree")
    assert _answer(["memory", "verify", run, "--repair"], capsys)[0] == 0
    assert _answer(["memory", "verify", run], capsys)[0] == 0
    assert _stored(run / "memory.lmdb") == LIVE


@pytest.mark.slow
def test_a_resume_on_a_cut_memory_is_one_line(run, capsys):
    """spade train on the run (a resume): the memory is checked before anything starts."""
    cfg = run / "config.toml"
    lines = [x for x in cfg.read_text().splitlines() if not x.startswith("ema_decay")]
    fixed = {"fixed_pool": 'fixed_pool = ""', "initial_memory": 'initial_memory = ""',
             "model": 'model = "smollm2-135m-instruct"'}  # fmt: skip
    cfg.write_text("\n".join(fixed.get(x.split(" =")[0], x) for x in lines) + "\n")
    (run / "memory.lmdb" / "data.mdb").write_bytes(DATA[: len(DATA) // 3])
    _one_line_2(["train", "configs/cpu-demo.toml", "--run-dir", run], capsys, expect="--repair")
