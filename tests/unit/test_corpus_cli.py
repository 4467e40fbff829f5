"""``spade corpus sample``."""

from __future__ import annotations

import json

import pytest

from spade_async.cli import main as spade


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPADE_CACHE", str(tmp_path / "cache"))


def test_sample_json_is_seeded(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i} " * 10}) + "\n" for i in range(20)) + "oops\n")
    assert spade(["corpus", "sample", str(path), "-n", "3", "--json", "--seed", "5", "--max-words", "4"]) == 0
    out = capsys.readouterr()
    docs = json.loads(out.out)
    assert len(docs) == 3 and all(d["truncated"] and len(d["text"].split()) == 4 for d in docs)
    assert "skipped 1 malformed line(s) (first: line 21)" in out.err
    assert spade(["corpus", "sample", str(path), "-n", "3", "--json", "--seed", "5", "--max-words", "4"]) == 0
    assert json.loads(capsys.readouterr().out) == docs


def test_sample_text_and_errors(tmp_path, capsys):
    assert spade(["corpus", "sample", "embedded", "-n", "1", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("=== ")
    assert spade(["corpus", "sample", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and len(err.splitlines()) == 1
    assert spade(["corpus", "sample", "embedded", "-n", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
