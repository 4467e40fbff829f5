"""Grounding corpora: open any supported format, sample documents uniformly, seeded.

    corpus = open_corpus(CorpusConfig(path="data/pile.jsonl"))
    docs = corpus.sample(4, seed=0)          # list[Document]; doc.id goes into the memory

Formats (chosen from the path): ``embedded`` (see ``embedded.py``), ``*.jsonl`` / ``*.json``
(offset index cached), ``*.parquet`` or a directory of parquet shards, a Hugging Face
``save_to_disk`` directory (``state.json`` or ``dataset_dict.json``), or a directory of
.txt / .md files. Missing, unreadable or empty corpora raise ``ConfigError`` (one line).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spade_async.corpus.base import CorpusConfig, Document, Reader, TokenTruncator, truncate_words
from spade_async.corpus.embedded import LABEL, NAME, embedded_path
from spade_async.corpus.jsonl import JsonlReader
from spade_async.errors import ConfigError

__all__ = ["Corpus", "CorpusConfig", "Document", "open_corpus"]


def _reader(path_str: str, cfg: CorpusConfig) -> tuple[Reader, str]:
    if path_str == NAME:
        return JsonlReader(embedded_path(), list(cfg.text_fields)), LABEL
    # pyarrow (~55 MB as a wheel) only for the formats that need it: the run loop imports
    # this package, and the GPU machine's carried wheels have no room for it
    from spade_async.corpus.columnar import ArrowDatasetReader, ParquetReader, TextDirReader

    path = Path(path_str).expanduser()
    if not path.exists():
        raise ConfigError(
            f"corpus '{path}' does not exist; pass a JSONL/parquet file, a "
            "directory of text files or a saved dataset, or 'embedded'"
        )
    fields = list(cfg.text_fields)
    try:
        if path.is_dir():
            if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
                return ArrowDatasetReader(path, fields, cfg.split), "Hugging Face dataset"
            if any(path.rglob("*.parquet")):
                return ParquetReader(path, fields), "parquet shards"
            return TextDirReader(path), "text directory"
        if path.suffix == ".parquet":
            return ParquetReader(path, fields), "parquet"
        return JsonlReader(path, fields), "JSONL"
    except PermissionError as exc:
        raise ConfigError(
            f"corpus '{path}' is unreadable ({exc.strerror}); check its permissions"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"corpus '{path}' is a directory the readers do not know") from None


class Corpus:
    """Uniform, seeded document sampling over a ``Reader``, with truncation."""

    def __init__(self, reader: Reader, kind: str, cfg: CorpusConfig):
        self.reader = reader
        self.kind = kind
        self.config = cfg
        if len(reader) == 0:
            raise ConfigError(
                f"corpus '{cfg.path}' ({kind}) holds no documents; point "
                "corpus.path at a non-empty corpus"
            )
        self._tokens: TokenTruncator | None = None

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def warning(self) -> str | None:
        return getattr(self.reader, "warning", None)

    def document(self, index: int) -> Document:
        doc_id, text = self.reader.read(index)
        if self.config.truncate == "tokens":
            if self._tokens is None:
                self._tokens = TokenTruncator(self._tokenizer_dir(), self.config.max_tokens)
            cut, truncated = self._tokens(text)
            return Document(id=doc_id, text=cut, words=len(text.split()), truncated=truncated)
        cut, words, truncated = truncate_words(text, self.config.max_words)
        return Document(id=doc_id, text=cut, words=words, truncated=truncated)

    def _tokenizer_dir(self) -> str:
        if self.config.tokenizer:
            return self.config.tokenizer
        from spade_async.models import tokenizer_dir

        return str(tokenizer_dir("smollm2-135m-instruct"))

    def sample(
        self, n: int, *, seed: int | None = None, rng: np.random.Generator | None = None
    ) -> list[Document]:
        """``n`` documents drawn uniformly (distinct while ``n <= len``), reproducible by seed."""
        if n < 1:
            raise ConfigError(f"asked for {n} documents; ask for at least 1")
        rng = rng or np.random.default_rng(seed)
        replace = n > len(self)
        picks = rng.choice(len(self), size=n, replace=replace) if len(self) > 1 else [0] * n
        return [self.document(int(i)) for i in picks]

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_corpus(cfg: CorpusConfig | str) -> Corpus:
    cfg = CorpusConfig(path=cfg) if isinstance(cfg, str) else cfg
    if cfg.max_words < 1 or cfg.max_tokens < 1:
        raise ConfigError(
            f"corpus.max_words={cfg.max_words} / max_tokens={cfg.max_tokens}: "
            "both must be at least 1"
        )
    reader, kind = _reader(cfg.path, cfg)
    return Corpus(reader, kind, cfg)
