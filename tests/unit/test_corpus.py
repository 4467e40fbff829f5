"""Corpus readers, cached offset index, seeded sampling, truncation, bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spade_async.corpus import CorpusConfig, jsonl, open_corpus
from spade_async.corpus.base import truncate_words
from spade_async.errors import ConfigError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPADE_CACHE", str(tmp_path / "cache"))


def _jsonl(path, n=50, bad=()):
    lines = []
    for i in range(n):
        if i in bad:
            lines.append("{not json" if i % 2 else json.dumps({"title": "no text field"}))
        else:
            key = "orig_doc" if i % 2 else "text"
            lines.append(json.dumps({key: f"doc {i} " + "word " * (i + 1)}))
    path.write_text("\n".join(lines) + "\n\n")
    return path


def test_jsonl_reads_text_and_orig_doc_with_line_ids(tmp_path):
    with open_corpus(str(_jsonl(tmp_path / "c.jsonl"))) as c:
        assert len(c) == 50 and c.warning is None
        assert c.document(3).text.startswith("doc 3 ") and c.document(3).id == "c.jsonl:4"
        assert c.document(4).text.startswith("doc 4 ")  # "text" and "orig_doc" both read


def test_malformed_lines_are_skipped_and_counted(tmp_path):
    with open_corpus(str(_jsonl(tmp_path / "c.jsonl", bad={6, 7, 20}))) as c:
        assert len(c) == 47
        assert c.warning == f"corpus '{tmp_path / 'c.jsonl'}': skipped 3 malformed line(s) (first: line 7)"
        texts = {d.text.split()[1] for d in c.sample(47, seed=0)}
        assert not texts & {"6", "7", "20"}


def test_index_is_cached_and_keyed_by_mtime(tmp_path, monkeypatch):
    path = _jsonl(tmp_path / "c.jsonl")
    open_corpus(str(path)).close()
    assert len(list((tmp_path / "cache" / "corpus-index").glob("c.jsonl-*.npz"))) == 1

    def boom(*a, **k):
        raise AssertionError("rescanned")

    scan = jsonl._scan
    monkeypatch.setattr(jsonl, "_scan", boom)
    with open_corpus(str(path)) as c:
        assert len(c) == 50
    _jsonl(path, n=60)  # a changed file gets a new index
    monkeypatch.setattr(jsonl, "_scan", scan)
    with open_corpus(str(path)) as c:
        assert len(c) == 60


def test_sampling_is_seeded_and_uniform(tmp_path):
    with open_corpus(str(_jsonl(tmp_path / "c.jsonl", n=10))) as c:
        a = [d.id for d in c.sample(5, seed=7)]
        assert a == [d.id for d in c.sample(5, seed=7)] and len(set(a)) == 5
        assert a != [d.id for d in c.sample(5, seed=8)]
        rng = np.random.default_rng(0)
        counts = np.bincount([int(c.sample(1, rng=rng)[0].id.split(":")[1]) - 1 for _ in range(3000)], minlength=10)
        assert counts.min() > 200 and counts.max() < 400


def test_truncation_by_words_keeps_layout():
    text = "one two\nthree   four\n\nfive six"
    assert truncate_words(text, 3) == ("one two\nthree", 6, True)
    assert truncate_words(text, 6) == (text, 6, False)


def test_truncation_by_tokens(tmp_path, tokenizer_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "hello world " * 200}) + "\n")
    cfg = CorpusConfig(path=str(path), truncate="tokens", max_tokens=10, tokenizer=str(tokenizer_path))
    with open_corpus(cfg) as c:
        doc = c.document(0)
    assert doc.truncated and doc.words == 400 and len(doc.text.split()) <= 10


def test_parquet_row_groups_and_shards(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    for shard in range(2):
        table = pa.table({"id": list(range(25)), "text": [f"s{shard} r{i}" for i in range(25)]})
        pq.write_table(table, folder / f"part-{shard}.parquet", row_group_size=7)
    with open_corpus(str(folder)) as c:
        assert len(c) == 50 and c.kind == "parquet shards"
        assert c.document(30).text == "s1 r5" and c.document(30).id == "part-1.parquet:5"
        assert len(c.reader.groups) == 8
    with open_corpus(str(folder / "part-0.parquet")) as c:
        assert c.document(24).text == "s0 r24"


def _saved_dataset(folder, texts, column="text"):
    """The layout ``datasets.Dataset.save_to_disk`` writes: Arrow IPC streams + state.json."""
    folder.mkdir(parents=True)
    files = []
    for k, chunk in enumerate([texts[: len(texts) // 2], texts[len(texts) // 2 :]]):
        name = f"data-{k:05d}-of-00002.arrow"
        table = pa.table({column: chunk, "n": list(range(len(chunk)))})
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=3)
        files.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": files, "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))


def test_hf_saved_dataset_and_dataset_dict(tmp_path):
    texts = [f"document {i}" for i in range(11)]
    _saved_dataset(tmp_path / "ds", texts)
    with open_corpus(str(tmp_path / "ds")) as c:
        assert len(c) == 11 and [c.document(i).text for i in range(11)] == texts
    _saved_dataset(tmp_path / "dd" / "train", texts, column="orig_doc")
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with open_corpus(str(tmp_path / "dd")) as c:
        assert c.document(10).text == "document 10"
    with pytest.raises(ConfigError, match="not 'test'"):
        open_corpus(CorpusConfig(path=str(tmp_path / "dd"), split="test"))


def test_text_directory(tmp_path):
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "a.txt").write_text("alpha text")
    (tmp_path / "t" / "sub" / "b.md").write_text("# beta")
    (tmp_path / "t" / "skip.bin").write_bytes(b"\0")
    with open_corpus(str(tmp_path / "t")) as c:
        assert len(c) == 2 and c.document(1).id == "sub/b.md" and c.document(0).text == "alpha text"


def test_embedded_corpus_is_labelled_stand_in():
    with open_corpus("embedded") as c:
        assert len(c) > 200 and "stand-in for a pretraining corpus" in c.kind
        ids = {d.id for d in c.sample(50, seed=0)}
        assert any(i.startswith("pydoc-topic:") or i.startswith("stdlib:") for i in ids)


@pytest.mark.parametrize("case", ["missing", "empty", "all_bad", "empty_dir", "bad_parquet", "no_column"])
def test_bad_corpora_are_one_clear_line(tmp_path, case):
    path = tmp_path / "c.jsonl"
    if case == "empty":
        path.write_text("\n\n")
    elif case == "all_bad":
        path.write_text("{\n[1,2]\n")
    elif case == "empty_dir":
        path = tmp_path / "d"
        path.mkdir()
    elif case == "bad_parquet":
        path = tmp_path / "x.parquet"
        path.write_bytes(b"not parquet at all")
    elif case == "no_column":
        path = tmp_path / "x.parquet"
        pq.write_table(pa.table({"body": ["x"]}), path)
    with pytest.raises(ConfigError) as err:
        open_corpus(str(path))
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg
    if case == "all_bad":
        assert "first: line 1" in msg
