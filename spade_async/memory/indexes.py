"""Secondary indexes: which (table, key, value) entries a record implies.

Every index entry is a pure function of one record, so a write deletes the entries of the
old version and puts those of the new one, and a consistency check can recompute them all.

| table    | key                              | value                       | holds                   |
|----------|----------------------------------|-----------------------------|-------------------------|
| skill    | skill                            | id (dupsort)                | every record            |
| status   | valid / invalid / duplicate      | id (dupsort)                | every record            |
| band     | regret band "0".."9"             | id (dupsort)                | valid originals         |
| ctx      | skill \\0 positive                | inv-regret + id (dupsort)   | highest regret first    |
| ctx      | skill \\0 too_easy / too_hard     | id (dupsort)                | uniform pick by id      |
| recent   | skill \\0 created-ns + id          | b""                         | valid originals         |
| recent   | \\1 created-ns + id                | b""                         | all skills              |
| replay   | inv-regret + id + last version   | b""                         | valid originals         |
| bands    | LSH band key                     | id (dupsort)                | valid originals         |
"""

from __future__ import annotations

import struct

from spade_async.memory.records import EnvRecord, ctx_class, regret_band

TABLES = ("records", "sigs", "meta", "skill", "status", "band", "ctx", "recent", "replay", "bands")
DUPSORT = frozenset({"skill", "status", "band", "ctx", "bands"})
INDEXES = ("skill", "status", "band", "ctx", "recent", "replay")  # derived from records alone

Entry = tuple[str, bytes, bytes]
ALL_SKILLS = b"\x01"
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")  # last version; -1 when never played


def inv_regret(regret: float) -> bytes:
    """8 bytes that sort ascending as regret descends (non-negative IEEE doubles)."""
    bits = struct.unpack(">Q", struct.pack(">d", max(0.0, float(regret))))[0]
    return _U64.pack(0xFFFF_FFFF_FFFF_FFFF - bits)


def pack_version(version: int | None) -> bytes:
    return _I64.pack(-1 if version is None else version)


def ctx_key(skill: str, cls: str) -> bytes:
    return skill.encode() + b"\x00" + cls.encode()


def recent_prefix(skill: str | None) -> bytes:
    return ALL_SKILLS if skill is None else skill.encode() + b"\x00"


def entries(rec: EnvRecord, bounds: dict[str, float]) -> set[Entry]:
    rid = rec.id.encode()
    out: set[Entry] = {("skill", rec.skill.encode(), rid), ("status", rec.status.encode(), rid)}
    if rec.status != "valid":
        return out
    regret = rec.stats.regret
    ns = _U64.pack(int(rec.created_at * 1e9))
    out.add(("band", str(regret_band(regret)).encode(), rid))
    out.add(("recent", recent_prefix(rec.skill) + ns + rid, b""))
    out.add(("recent", ALL_SKILLS + ns + rid, b""))
    last = (
        rec.stats.last_version if rec.stats.last_version is not None else rec.origin.policy_version
    )
    out.add(("replay", inv_regret(regret) + rid + pack_version(last), b""))
    cls = ctx_class(rec, **bounds)
    if cls == "positive":
        out.add(("ctx", ctx_key(rec.skill, cls), inv_regret(regret) + rid))
    elif cls is not None:
        out.add(("ctx", ctx_key(rec.skill, cls), rid))
    return out
