"""The run directory: every artefact of one run under ``runs/<name>/`` (docs/running.md).

config.toml          the resolved config (recipe + overrides), written once
memory.lmdb/         environment memory (spade_async.memory)
checkpoints/step-N/  sharded trainer state + controller state (latest wins on resume)
hf/                  latest Hugging Face export (transformers and SGLang load it)
metrics.jsonl        one record per line (spade_async.telemetry.metrics)
envs/                every generated environment file with its verdict (<id>.py, <id>.json)
episodes/            sampled transcripts as readable text
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from spade_async.errors import ConfigError


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def memory(self) -> Path:
        return self.root / "memory.lmdb"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def envs(self) -> Path:
        return self.root / "envs"

    @property
    def episodes(self) -> Path:
        return self.root / "episodes"

    def create(self) -> RunDir:
        for p in (self.root, self.checkpoints, self.envs, self.episodes):
            p.mkdir(parents=True, exist_ok=True)
        return self

    def exists(self) -> bool:
        return self.config.is_file()

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest *complete* checkpoint (one with its ``DONE`` marker)."""
        best = None
        if self.checkpoints.is_dir():
            for p in self.checkpoints.iterdir():
                m = re.fullmatch(r"step-(\d+)", p.name)
                if m and (p / "DONE").is_file() and (best is None or int(m.group(1)) > best[0]):
                    best = (int(m.group(1)), p)
        return best

    def write_config(self, config: msgspec.Struct) -> None:
        import tomli_w

        data = _drop_none(msgspec.to_builtins(config))  # TOML has no null: None = the default
        write_atomic(self.config, tomli_w.dumps(data).encode())

    def save_env(self, env_id: str, source: str, verdict: msgspec.Struct | dict) -> None:
        self.envs.mkdir(parents=True, exist_ok=True)
        write_atomic(self.envs / f"{env_id}.py", source.encode())
        write_atomic(
            self.envs / f"{env_id}.json", msgspec.json.format(msgspec.json.encode(verdict))
        )

    def save_transcript(self, name: str, text: str) -> Path:
        path = self.episodes / f"{name}.txt"
        write_atomic(path, text.encode())
        return path


def _drop_none(obj):
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


def default_run_dir(config_path: str | Path) -> Path:
    stem = Path(config_path).stem
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise ConfigError(f"{what} '{path}' is not a directory")
    return path
