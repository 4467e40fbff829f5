"""``spade memory`` commands: JSON shapes, byte-identical export, one-line errors."""

from __future__ import annotations

import json

import lmdb
from test_memory_helpers import env_source, record

from spade_async.cli import main as spade
from spade_async.memory.records import Origin, make_record
from spade_async.memory.store import MemoryStore


def _run_dir(tmp_path):
    run = tmp_path / "run"
    with MemoryStore(run / "memory.lmdb") as store:
        # odd bytes on purpose: CRLF, a comment, trailing spaces, no final newline
        odd = ("# hand-written\r\n" + env_source(1).replace("\n", "\r\n") + "   ").encode()
        store.put(make_record(odd, origin=Origin(kind="import", source="x.py"), valid=True,
                              stage="ok", skill="Optimization", env_class="Puzzle1Env"))
        store.put(record(2, version=4))
        store.put(record(3, valid=False))
    return run, odd


def test_ls_stats_show_json(tmp_path, capsys):
    run, _ = _run_dir(tmp_path)
    assert spade(["memory", "ls", "--run", str(run), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3
    for row in rows:
        assert {"id", "env_class", "skill", "status", "origin"} <= set(row)
    assert {r["origin"] for r in rows} == {"import", "designer@v4", "designer@v0"}
    assert spade(["memory", "stats", "--run", str(run), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["total"], stats["valid"], stats["duplicates"]) == (3, 2, 0)
    assert spade(["memory", "show", rows[0]["id"][:8], "--run", str(run), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == rows[0]["id"] and "class Puzzle" in shown["code"]
    assert spade(["memory", "ls", "--run", str(run), "--status", "invalid", "--json"]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["invalid"]


def test_export_is_byte_identical(tmp_path, capsys):
    run, odd = _run_dir(tmp_path)
    dest = tmp_path / "out"
    assert spade(["memory", "export", str(dest), "--run", str(run)]) == 0
    manifest = [json.loads(line) for line in (dest / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 3
    by_skill = {m["skill"]: m for m in manifest}
    assert (dest / by_skill["Optimization"]["file"]).read_bytes() == odd
    with MemoryStore(run / "memory.lmdb", readonly=True) as store:
        for m in manifest:
            assert (dest / f"{m['id']}.py").read_bytes() == store.get(m["id"]).source


def test_errors_are_one_line(tmp_path, capsys):
    assert spade(["memory", "ls", "--run", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no environment memory" in err and len(err.splitlines()) == 1
    run, _ = _run_dir(tmp_path)
    assert spade(["memory", "show", "ffffffff", "--run", str(run)]) == 2
    assert "no environment with id 'ffffffff'" in capsys.readouterr().err
    env = lmdb.open(str(run / "memory.lmdb"), max_dbs=16)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"schema_version", b"2", db=meta)
    env.close()
    assert spade(["memory", "stats", "--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "schema v2" in err and len(err.splitlines()) == 1
    assert spade(["memory", "ls"]) == 2
    assert "--run" in capsys.readouterr().err
