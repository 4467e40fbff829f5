"""Environment records: the msgspec schema stored in ``memory.lmdb``, ids and classes.

One ``EnvRecord`` per environment, keyed by ``env_id(code)``: the sha256 of the code
normalised by an ``ast`` round trip (comments, blank lines and formatting do not make a new
environment). ``source`` keeps the original bytes so ``spade memory export`` is
byte-identical. Records are map-encoded msgpack so later schema versions can add fields; a
record or store written by a newer schema is refused with one clear line.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import time
from typing import Literal

import msgspec

from spade_async.errors import ConfigError

SCHEMA_VERSION = 1

Setting = Literal["games", "tool_use"]
OriginKind = Literal["designer", "pool", "import"]
Status = Literal["valid", "invalid", "duplicate", "quarantined"]
CtxClass = Literal["positive", "too_easy", "too_hard"]


class Origin(msgspec.Struct, frozen=True, kw_only=True):
    """Where an environment came from."""

    kind: OriginKind
    policy_version: int | None = None  # designer: the policy version that wrote it
    source: str | None = None  # import / pool: the file it was read from


class Stats(msgspec.Struct, frozen=True, kw_only=True):
    """Statistics accumulated over the run (sums, so updates are order-free)."""

    plays_hint: int = 0
    wins_hint: float = 0.0
    plays_nohint: int = 0
    wins_nohint: float = 0.0
    regret_sum: float = 0.0
    regret_updates: int = 0
    designer_reward_sum: float = 0.0
    designer_reward_updates: int = 0
    times_replayed: int = 0
    first_version: int | None = None
    last_version: int | None = None

    @property
    def win_rate_hint(self) -> float | None:
        return self.wins_hint / self.plays_hint if self.plays_hint else None

    @property
    def win_rate_nohint(self) -> float | None:
        return self.wins_nohint / self.plays_nohint if self.plays_nohint else None

    @property
    def regret(self) -> float:
        return self.regret_sum / self.regret_updates if self.regret_updates else 0.0

    @property
    def designer_reward(self) -> float | None:
        n = self.designer_reward_updates
        return self.designer_reward_sum / n if n else None


class EnvRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One environment, as stored. ``id`` is the sha256 hex of the normalised code."""

    schema_version: int = SCHEMA_VERSION
    id: str
    source: bytes  # the original file bytes, exported unchanged
    env_class: str | None = None
    hints: list[str] = []
    skill: str = ""
    setting: Setting = "games"
    doc_id: str | None = None
    origin: Origin
    valid: bool
    stage: str  # "ok" or the first failing validation stage
    reason: str = ""
    multi_turn: bool | None = None
    feasibility: str | None = None
    duplicate_of: str | None = None  # near-duplicate twin (an earlier record's id)
    similarity: float | None = None  # estimated Jaccard similarity to the twin
    exact_repeats: int = 0  # times the same normalised code was submitted again
    near_copies: int = 0  # times a later environment was a near-duplicate of this one
    stats: Stats = msgspec.field(default_factory=Stats)
    # an audit in training failed (loop/audits.py): "<reason>: <detail>", and the step; a
    # quarantined environment leaves every sampling index for good
    quarantine: str = ""
    quarantine_step: int | None = None
    shown: list[str] = []  # lineage: ids of the memory examples its designer prompt showed
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def code(self) -> str:
        return self.source.decode("utf-8", errors="replace")

    @property
    def status(self) -> Status:
        if not self.valid:
            return "invalid"
        if self.quarantine:
            return "quarantined"
        return "duplicate" if self.duplicate_of else "valid"


class _Header(msgspec.Struct):
    schema_version: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EnvRecord)
_header = msgspec.msgpack.Decoder(_Header)


def encode(record: EnvRecord) -> bytes:
    return _encoder.encode(record)


def decode(data: bytes) -> EnvRecord:
    try:
        record = _decoder.decode(data)
    except msgspec.ValidationError:
        version = _header.decode(data).schema_version
        if version > SCHEMA_VERSION:
            raise newer_schema(version, "record") from None
        raise
    if record.schema_version > SCHEMA_VERSION:
        raise newer_schema(record.schema_version, "record")
    return record


_SAFE_ID = re.compile(r"[0-9a-f]{64}")
MAX_SKILL_BYTES = 200  # LMDB keys hold 511 bytes; index keys add the class and an id


def safe_id(value: object) -> bool:
    """An id is the sha256 hex of the code: it names files (export) and modules."""
    return isinstance(value, str) and _SAFE_ID.fullmatch(value) is not None


def skill_problem(skill: object) -> str | None:
    """Why ``skill`` cannot be stored (None when it can): a non-empty one-line str of at
    most ``MAX_SKILL_BYTES`` UTF-8 bytes, no control characters (index keys use NUL)."""
    from spade_async.safe_text import is_clean, term

    if not isinstance(skill, str):
        return f"skill is a {type(skill).__name__}, not a string"
    if not skill.strip():
        return "skill is empty"
    try:
        size = len(skill.encode("utf-8"))
    except UnicodeEncodeError:
        return f"skill '{term(skill, limit=40)}' is not valid Unicode (a lone surrogate)"
    if size > MAX_SKILL_BYTES:
        return f"skill is {size} bytes long (at most {MAX_SKILL_BYTES})"
    if not is_clean(skill):
        return f"skill '{term(skill, limit=40)}' holds control characters"
    return None


def record_problem(rec: EnvRecord) -> str | None:
    """Why a stored record is unusable (None when it is fine): what ``spade memory verify``
    and every reader check, since a record may come from a tampered store."""
    if not safe_id(rec.id):
        return "its id is not a sha256 hex string (a tampered record)"
    return skill_problem(rec.skill) if rec.skill else None


def newer_schema(version: int, what: str) -> ConfigError:
    return ConfigError(
        f"this {what} was written by memory schema v{version}, but this spade-async reads up "
        f"to v{SCHEMA_VERSION}; upgrade spade-async to open it (nothing was changed)"
    )


@functools.lru_cache(maxsize=256)  # the id and the MinHash of one record both need it
def normalize(code: str) -> str:
    """Code without comments, blank lines or formatting (an ``ast`` round trip).

    Code that does not parse falls back to dropping comment-only and blank lines and
    trailing whitespace, so broken environments still get stable ids.
    """
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        lines = (line.rstrip() for line in code.splitlines())
        return "\n".join(line for line in lines if line and not line.lstrip().startswith("#"))


def env_id(code: str) -> str:
    return hashlib.sha256(normalize(code).encode("utf-8", errors="replace")).hexdigest()


def make_record(
    source: bytes | str, *, origin: Origin, valid: bool, stage: str, **fields
) -> EnvRecord:
    """A new record for ``source`` (its id computed from the normalised code)."""
    data = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    code = data.decode("utf-8", errors="replace")
    return EnvRecord(
        id=env_id(code), source=data, origin=origin, valid=valid, stage=stage, **fields
    )


def ctx_class(
    record: EnvRecord, *, low: float, high: float, easy: float, hard: float
) -> CtxClass | None:
    """SPADE's classes by no-hint win rate: positive in [low, high], too easy / too hard."""
    if record.status != "valid":
        return None
    rate = record.stats.win_rate_nohint
    if rate is None:
        return None
    if low <= rate <= high:
        return "positive"
    if rate > easy:
        return "too_easy"
    if rate < hard:
        return "too_hard"
    return None


def regret_band(regret: float, width: float = 0.1) -> int:
    """Regret band index: 0 for [0, width), ... capped at 9."""
    return max(0, min(9, int(regret / width)))


def now() -> float:
    return time.time()
