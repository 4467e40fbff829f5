"""Phase shares of wall time per component, from the cumulative busy-time meters.

Shared by the live dashboard (last interval) and ``spade report`` (whole run and per
step). Busy keys are ``Meters`` stages: ``engine`` (generation requests in flight),
``env_pool`` (environment calls: agent steps and the designer's validation gates),
``trainer`` (any trainer call) split into ``train`` (train steps) and ``push`` (weight
pushes, during which the engines receive weights).
"""

from __future__ import annotations

from typing import Any

PHASES = {  # component -> [(phase, busy_s key)], shares of wall time (time/elapsed_s)
    "engines": [("generation", "busy_s/engine"), ("weight push", "busy_s/push")],
    "sandbox pool": [("env execution", "busy_s/env_pool")],
    "trainer": [("training", "busy_s/train"), ("weight push", "busy_s/push")],
}


def phase_shares(rec: dict[str, Any], prev: dict[str, Any] | None = None) -> dict:
    """component -> {phase: share of wall time} over ``prev`` -> ``rec`` (cumulative
    counters; the whole run when ``prev`` is None), with ``idle`` as the rest. A phase the
    run did not meter (an older version) is left out; the trainer's busy time without its
    training/push split is 'busy (unsplit)'."""

    def delta(key: str) -> float | None:
        v = rec.get(key)
        if not isinstance(v, (int, float)):
            return None
        p = (prev or {}).get(key, 0.0)
        return float(v) - float(p if isinstance(p, (int, float)) else 0.0)

    wall = delta("time/elapsed_s")
    if not wall or wall <= 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    for comp, phases in PHASES.items():
        shares = {}
        for phase, key in phases:
            d = delta(key)
            if d is not None:
                shares[phase] = min(1.0, max(0.0, d / wall))
        if comp == "trainer":
            busy = delta("busy_s/trainer")
            if busy is not None:
                other = busy / wall - sum(shares.values())
                if not shares:
                    shares["busy (unsplit)"] = min(1.0, max(0.0, busy / wall))
                elif other > 1e-3:
                    shares["checkpoint, other"] = min(1.0, other)
        if not shares:
            continue
        shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
        out[comp] = shares
    return out
