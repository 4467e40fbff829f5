"""A run directory whose every model-written or run-written field carries a payload.

``build(root, marker)`` writes config.toml, memory.lmdb (one record per payload, the payload
in every text field a store keeps; the skill where ``records.skill_problem`` admits it),
metrics.jsonl (payloads as metric names, event messages, environment fields, a string
where a number belongs), episodes/records.jsonl and episodes/replay.json (payloads as
statuses, verdict keys, details). It returns what the tests check against.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec
import tomli_w
from payloads import flat, storable_skill

from spade_async.envs.examples import HERE
from spade_async.episodes.records import EpisodeRecord, Outcome, Summary
from spade_async.memory.records import EnvRecord, Origin, Stats
from spade_async.memory.repair import write_store

HONEST = (HERE / "modular_lock.py").read_text()


def tool_source(p: str) -> str:
    """A tool-use environment whose tool name, docstring and comment hold ``p``."""
    return (
        f"class PlantedEnv(ToolUseBaseEnv):  # {p}\n"
        f"    {p!r}\n"
        "    def reset(self, seed=None):\n"
        f"        self._tools = {{{p!r}: {{'description': {p!r}, 'parameters': {{}}}}}}\n"
        "        self._expected_answer = '1'\n"
        "        return 'obs', {}\n"
        "    def solution(self):\n"
        "        return ['<answer>1</answer>']\n"
    )


def _id(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def records(marker: str) -> list[EnvRecord]:
    out = []
    for n, (name, p) in enumerate(sorted(flat(marker).items())):
        tool = n % 2 == 1
        out.append(EnvRecord(
            id=_id(name), source=(tool_source(p) if tool else HONEST + f"\n# {p}\n").encode(),
            env_class=p, hints=[p, "hint"], skill=p if storable_skill(p) else "planted",
            setting="tool_use" if tool else "games", doc_id=p,
            origin=Origin(kind="designer", policy_version=n, source=p), valid=True,
            stage="ok", reason=f"passed on seeds [0, 1] {p}", feasibility=p,
            stats=Stats(plays_hint=4, wins_hint=3.0, plays_nohint=4, wins_nohint=1.0,
                        regret_sum=0.5 + n / 100, regret_updates=1),
            shown=[_id(name), p], created_at=1000.0 + n, updated_at=1000.0 + n,
        ))  # fmt: skip
    return out


def build(root: Path, marker: str | Path) -> dict:
    marker = str(marker)
    pay = flat(marker)
    root.mkdir(parents=True, exist_ok=True)
    name = pay["html/img_onerror"] + pay["bidi/rlo"]
    (root / "config.toml").write_text(tomli_w.dumps({"name": name, "max_steps": 3}))
    recs = records(marker)
    write_store(recs, root / "memory.lmdb")
    lines = []
    for step, (_key, p) in enumerate(sorted(pay.items()), start=1):
        lines.append({"step": step, "time": 1000.0 + step, "kind": "step", "version": step,
                      "max_steps": 3, "time/elapsed_s": "soon" if step % 2 else p,
                      f"tokens_per_s/{p}": 10.0, f"busy_s/{p}": 1.0, f"idle_s/{p}": 1.0,
                      f"stream/{p}/fill": 1, f"stream/{p}/capacity": 2,
                      f"designer/stage/{p}": 1, "designer/generated": 2, p: 0.5,
                      "reward/agent_mean": 0.1 * step, "regret/values": [0.2, p]})  # fmt: skip
        lines.append({"step": step, "time": 1000.5 + step, "kind": "env", "env_id": p,
                      "env_class": p, "skill": p, "stage": p, "valid": False,
                      "win_rate": p, "regret": None})  # fmt: skip
        lines.append({"step": step, "time": 1000.6 + step, "kind": "event", "level": p,
                      "message": p})  # fmt: skip
        lines.append({"step": step, "time": 1000.7 + step, "kind": "eval",
                      "eval/policy_version": step, f"eval/s{step}/{p}": 0.5})  # fmt: skip
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    eps = []
    for n, (_key, p) in enumerate(sorted(pay.items())):
        eps.append(EpisodeRecord(
            id=f"s1-{n:08x}", step=1, env_id=recs[n].id, code_sha256="0" * 64,
            setting=p, seed=n, hinted=False, actions=[p], turn_versions=[1],
            obs_hashes=["a", "b"], step_rewards=[0.0], step_flags=[(False, True)],
            reward=0.0, status=p, error_kind=p,
        ))  # fmt: skip
    (root / "episodes").mkdir(exist_ok=True)
    enc = msgspec.json.Encoder()
    (root / "episodes" / "records.jsonl").write_bytes(b"".join(enc.encode(e) + b"\n" for e in eps))
    outcomes = [Outcome(id=e.id, env_id=e.env_id, verdict="mismatch", call=1, detail=e.status)
                for e in eps]  # fmt: skip
    summary = Summary(checked=len(eps), exact=0, share=0.0,
                      by_verdict={p: 1 for p in pay.values()},
                      flagged_envs={p: 1 for p in pay.values()}, outcomes=outcomes)  # fmt: skip
    (root / "episodes" / "replay.json").write_bytes(msgspec.json.encode(summary))
    return {"payloads": pay, "records": recs, "episodes": eps}
