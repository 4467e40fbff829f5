"""Documents, the reader interface, truncation, and the corpus config."""

from __future__ import annotations

import itertools
import re
from typing import Literal, Protocol

import msgspec

from spade_async.config import Doc


class CorpusConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Grounding corpus for the designer."""

    path: Doc(
        str,
        "JSONL file, parquet file or directory, text/markdown directory, Hugging Face dataset saved to disk, or 'embedded' (a small stand-in built from Python's own docs)",
    ) = "embedded"
    text_fields: Doc(tuple[str, ...], "fields tried in order for a document's text") = (
        "text",
        "orig_doc",
    )
    truncate: Doc(Literal["words", "tokens"], "unit documents are truncated in") = "words"
    max_words: Doc(int, "documents longer than this many words are cut (SPADE: 6000)") = 6000
    max_tokens: Doc(int, "documents longer than this many tokens are cut (truncate = 'tokens')") = (
        8192
    )
    tokenizer: Doc(
        str | None, "tokenizer directory for truncate = 'tokens' (default: the run's model)"
    ) = None
    split: Doc(str, "split to read from a saved Hugging Face DatasetDict") = "train"


class Document(msgspec.Struct, frozen=True, kw_only=True):
    """A sampled grounding document; ``id`` is recorded with every environment it grounds."""

    id: str
    text: str
    words: int  # words in the original document
    truncated: bool = False


class Reader(Protocol):
    """Random access by document index, without holding the corpus in memory."""

    name: str

    def __len__(self) -> int: ...

    def read(self, index: int) -> tuple[str, str]:
        """(document id, full text) of document ``index``."""
        ...


def pick_text(obj: object, fields: list[str]) -> str | None:
    if not isinstance(obj, dict):
        return None
    for f in fields:
        value = obj.get(f)
        if isinstance(value, str):
            return value
    return None


_WORD = re.compile(r"\S+")


def truncate_words(text: str, max_words: int) -> tuple[str, int, bool]:
    """(text cut after ``max_words`` words keeping its layout, word count, was cut)."""
    n = len(text.split())
    if n <= max_words:
        return text, n, False
    last = next(itertools.islice(_WORD.finditer(text), max_words - 1, None))
    return text[: last.end()], n, True


class TokenTruncator:
    """Cuts by tokens with a transformers tokenizer (loaded once)."""

    def __init__(self, tokenizer_dir: str, max_tokens: int):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.max_tokens = max_tokens

    def __call__(self, text: str) -> tuple[str, bool]:
        ids = self.tok.encode(text, add_special_tokens=False)
        if len(ids) <= self.max_tokens:
            return text, False
        return self.tok.decode(ids[: self.max_tokens]), True
