"""Parquet files (or directories of shards) and Hugging Face datasets saved to disk.

Parquet: row-group aware -- the footer gives each row group's row count, a sample reads
only the text column of the one row group that holds it (the last two are kept).

Hugging Face ``save_to_disk`` output is read with pyarrow directly (no ``datasets``
dependency): ``state.json`` lists the ``_data_files`` (Arrow IPC streams), which are
memory-mapped, so batches are views into the page cache, not copies. A ``DatasetDict``
(``dataset_dict.json`` + one folder per split) is read at the configured split.
"""

from __future__ import annotations

import bisect
import json
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spade_async.errors import ConfigError


def _text_column(schema: pa.Schema, fields: list[str], where: Path) -> str:
    for f in fields:
        if f in schema.names:
            return f
    raise ConfigError(
        f"corpus '{where}' has no {' / '.join(fields)} column (columns: {', '.join(schema.names)}); "
        "set corpus.text_fields to the column holding the text"
    )


class ParquetReader:
    def __init__(self, path: Path, fields: list[str]):
        self.path = path
        self.name = path.name
        files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
        # (file, row group, column, file's name, row group's first row within the file)
        self.groups: list[tuple[pq.ParquetFile, int, str, str, int]] = []
        self.starts: list[int] = []
        total = 0
        for file in files:
            in_file = 0
            try:
                pf = pq.ParquetFile(file)
            except (pa.ArrowInvalid, OSError) as exc:
                raise ConfigError(f"corpus file '{file}' is not readable parquet: {exc}") from None
            col = _text_column(pf.schema_arrow, fields, file)
            for g in range(pf.metadata.num_row_groups):
                rows = pf.metadata.row_group(g).num_rows
                if rows:
                    self.groups.append((pf, g, col, file.name, in_file))
                    self.starts.append(total)
                    total += rows
                    in_file += rows
        self.total = total
        self._group = lru_cache(maxsize=2)(self._load_group)

    def _load_group(self, k: int) -> pa.ChunkedArray:
        pf, g, col, _, _ = self.groups[k]
        return pf.read_row_group(g, columns=[col]).column(0)

    def __len__(self) -> int:
        return self.total

    def read(self, index: int) -> tuple[str, str]:
        k = bisect.bisect_right(self.starts, index) - 1
        row = index - self.starts[k]
        _, _, _, fname, first = self.groups[k]
        return f"{fname}:{first + row}", self._group(k)[row].as_py() or ""

    def close(self) -> None:
        self._group.cache_clear()


class ArrowDatasetReader:
    """A ``datasets.Dataset.save_to_disk`` directory, read with pyarrow."""

    def __init__(self, path: Path, fields: list[str], split: str):
        self.name = path.name
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            if split not in splits:
                raise ConfigError(
                    f"corpus '{path}' has splits {splits}, not '{split}'; "
                    "set corpus.split to one of them"
                )
            path = path / split
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / d["filename"] for d in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"corpus '{path}' is not a saved Hugging Face dataset "
                f"(state.json unreadable: {exc})"
            ) from None
        self.batches: list[pa.Array] = []
        self.starts: list[int] = []
        total = 0
        for file in files:
            try:
                reader = pa.ipc.open_stream(pa.memory_map(str(file), "r"))
            except (pa.ArrowInvalid, OSError) as exc:
                raise ConfigError(f"corpus file '{file}' is not an Arrow stream: {exc}") from None
            col = _text_column(reader.schema, fields, file)
            for batch in reader:
                if batch.num_rows:
                    self.batches.append(batch.column(col))
                    self.starts.append(total)
                    total += batch.num_rows
        self.total = total

    def __len__(self) -> int:
        return self.total

    def read(self, index: int) -> tuple[str, str]:
        k = bisect.bisect_right(self.starts, index) - 1
        return f"{self.name}:{index}", self.batches[k][index - self.starts[k]].as_py() or ""

    def close(self) -> None:
        self.batches.clear()


class TextDirReader:
    """A directory of .txt / .md files: one document per file, id = relative path."""

    SUFFIXES = (".txt", ".md", ".markdown", ".rst")

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.files = sorted(
            p for p in path.rglob("*") if p.suffix.lower() in self.SUFFIXES and p.is_file()
        )

    def __len__(self) -> int:
        return len(self.files)

    def read(self, index: int) -> tuple[str, str]:
        file = self.files[index]
        rel = file.relative_to(self.path).as_posix()
        try:
            return rel, file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"corpus file '{file}' is unreadable: {exc}") from None

    def close(self) -> None:
        pass
