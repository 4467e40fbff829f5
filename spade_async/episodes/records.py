"""``RUN_DIR/episodes/records.jsonl``: one line per agent episode, what replay needs.

A record holds the environment's memory id and the sha256 of the exact source it ran, the
reset seed, the actions the environment received (the agent's replies without reasoning),
the policy version of every turn, each step's reward and (terminated, truncated), and the
sha256 of the reset observation and of every step's observation. An episode the
environment failed (an ``EnvError``) keeps the calls that completed and the error's kind,
so a replay must fail the same way at the same call. Lines are appended as episodes end
(``log_episode``, called from the loop); a line torn by a kill is skipped on reading.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Literal

import msgspec

from spade_async.errors import UsageError
from spade_async.safe_text import term

RECORDS_FILE = "records.jsonl"
SUMMARY_FILE = "replay.json"  # the last ``spade episode replay --all``
RECORD_VERSION = 1


class EpisodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One agent episode as replay needs it."""

    version: int = RECORD_VERSION  # record schema
    id: str  # unique in the run: "s<step>-<8 hex>"
    step: int  # trainer steps done when the episode was played
    env_id: str  # the environment's memory id (sha256 of its normalised code)
    code_sha256: str  # sha256 of the exact source the episode ran
    setting: str = "games"
    seed: int
    hinted: bool
    actions: list[str]  # what each pool.step received
    turn_versions: list[int]  # policy version that generated each turn
    obs_hashes: list[str]  # sha256 of the reset observation, then of each step's
    step_rewards: list[float]
    step_flags: list[tuple[bool, bool]]  # (terminated, truncated) of each step
    reward: float  # the episode's outcome reward
    status: str
    error_kind: str = ""  # an EnvError's kind when the environment failed the episode


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(EpisodeRecord)


def code_sha256(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def make_record(ep, *, step: int, source: str, setting: str = "games") -> EpisodeRecord:
    """The record of a ``roles.agent.Episode`` played on ``source``."""
    return EpisodeRecord(
        id=f"s{step}-{uuid.uuid4().hex[:8]}",
        step=step,
        env_id=ep.env_id,
        code_sha256=code_sha256(source),
        setting=setting,
        seed=ep.seed,
        hinted=ep.hinted,
        actions=list(ep.actions),
        turn_versions=list(ep.turn_versions),
        obs_hashes=list(ep.obs_hashes),
        step_rewards=list(ep.step_rewards),
        step_flags=[(bool(a), bool(b)) for a, b in ep.step_flags],
        reward=float(ep.reward),
        status=str(ep.status),
        error_kind=ep.error_kind,
    )


def records_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "episodes" / RECORDS_FILE


def append(run_dir: str | Path, records: list[EpisodeRecord]) -> None:
    """Append records, one line each, in one write (a line is never split across writes)."""
    if not records:
        return
    path = records_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(_encoder.encode(r) + b"\n" for r in records)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def chosen(env_id: str, seed: int, share: float) -> bool:
    """Whether an episode is recorded at ``share`` < 1: a hash of environment and seed, so
    the choice draws nothing from the run's random generator (the run stays the same)."""
    if share >= 1.0:
        return True
    h = hashlib.sha256(f"{env_id}:{seed}".encode()).digest()
    return int.from_bytes(h[:8], "big") < share * 2**64


def log_episode(rt, env, ep) -> EpisodeRecord | None:
    """The loop's side: record ``ep`` (played on ``env``, an ``EnvRef``) in ``rt``'s run,
    if ``telemetry.replay_records`` chooses it."""
    share = getattr(getattr(rt.cfg, "telemetry", None), "replay_records", 1.0)
    if not chosen(ep.env_id, ep.seed, share):
        return None
    rec = make_record(ep, step=rt.state.step, source=env.source, setting=env.setting)
    append(rt.run_dir.root, [rec])
    return rec


MAX_LINE = 16 << 20  # bytes: a longer line is damage, not an episode
_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def episode_problem(rec: EpisodeRecord) -> str | None:
    """Why a decoded record cannot be replayed or shown (None when it is whole): ids that
    name nothing safely, or per-step lists that do not line up (the loop's invariants)."""
    if not _SAFE.fullmatch(rec.id) or not _SAFE.fullmatch(rec.env_id):
        return "an id that is not a short safe name"
    steps = len(rec.step_rewards)
    if len(rec.step_flags) != steps or steps != max(0, len(rec.obs_hashes) - 1):
        return "step rewards, flags and observations do not line up"
    if not steps <= len(rec.actions) <= steps + 1:
        return "actions do not line up with the steps"
    return None


def read_records(run_dir: str | Path) -> tuple[list[EpisodeRecord], int]:
    """Every record of the run and how many lines could not be read (torn, foreign, or
    not whole: ``episode_problem``); a bad line is skipped and counted, never fatal."""
    path = records_path(run_dir)
    if not path.is_file():
        return [], 0
    out, bad = [], 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = _decoder.decode(line) if len(line) <= MAX_LINE else None
        except msgspec.DecodeError:
            rec = None
        if rec is None or episode_problem(rec) is not None:
            bad += 1
        else:
            out.append(rec)
    return out, bad


def find(run_dir: str | Path, episode_id: str) -> EpisodeRecord:
    records, _ = read_records(run_dir)
    hits = [r for r in records if r.id == episode_id] or [
        r for r in records if r.id.startswith(episode_id)
    ]
    if not hits:
        raise UsageError(
            f"no episode '{term(episode_id, limit=80)}' in {records_path(run_dir)}; "
            f"list them with 'spade episode ls {run_dir}'"
        )
    if len(hits) > 1:
        raise UsageError(f"episode id '{episode_id}' is ambiguous; give more characters")
    return hits[0]


# -- replay results (spade_async.episodes.replay writes them; spade report reads) -----
Verdict = Literal["exact", "mismatch", "no_code", "code_changed", "not_checked"]


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    env_id: str
    verdict: Verdict
    call: int | None = None  # first call that differs: 0 = reset, k = the k-th step
    detail: str = ""

    @property
    def exact(self) -> bool:
        return self.verdict == "exact"


class Summary(msgspec.Struct, kw_only=True):
    checked: int
    exact: int
    share: float
    by_verdict: dict[str, int]
    flagged_envs: dict[str, int]  # memory environments with episodes that no longer replay
    outcomes: list[Outcome]


def write_summary(run_dir: Path, summary: Summary) -> Path:
    from spade_async.rundir import write_atomic

    path = run_dir / "episodes" / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, msgspec.json.format(msgspec.json.encode(summary)))
    return path


def read_summary(run_dir: Path) -> Summary | None:
    path = run_dir / "episodes" / SUMMARY_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=Summary)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
