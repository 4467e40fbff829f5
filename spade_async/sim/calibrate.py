"""Costs measured on this machine: ``bench/pipeline.py``'s saved stage timings.

Each stage's cost is its least busy time in either schedule (uncontended work, as the
pipeline bench's ideal bound takes it), per trainer step:

- engine: busy seconds over the step's decode iterations (every play's turn in one batch:
  the workload's 4 environments x plays rows), split into a fixed part and a per-row part
  with the CPU engine's measured vocab-head slope (``bench/pipeline.py``, ``older_first``:
  15 ms at 32 rows, 25 ms at 64: 0.31 ms a row);
- trainer: train busy per step (every step trains the same samples); push: push busy per step;
- environment step: env-pool busy over the step's turns (a turn's steps run side by side).

The reply length and turn count are the workload's own (fixed: 2 turns, ``turn_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path

from spade_async.sim.costs import Costs, Lengths

__all__ = ["cpu_costs", "ROW_SLOPE_S"]

ROW_SLOPE_S = (0.025 - 0.015) / 32  # bench/pipeline.py older_first(): vocab head per row


def cpu_costs(saved: str | Path | dict) -> Costs:
    """``Costs`` for the CPU workload a saved ``bench/pipeline.py`` result ran."""
    d = saved if isinstance(saved, dict) else json.loads(Path(saved).read_text())
    w, s, a = d["workload"], d["sync"], d["async"]
    steps = s["steps"]
    turns, rows = w["turns"], w["envs"] * w["plays"]

    def least(stage: str) -> float:
        return min(s["busy_s"].get(stage, 0.0), a["busy_s"].get(stage, 0.0)) / steps

    iter_s = least("engine") / (turns * w["turn_tokens"])
    push = least("push")
    train = least("trainer") - push
    return Costs(
        name=f"{w['name']} on this machine ({d['hardware'].get('cpu', '?')}, saved run)",
        engines=1,
        iter_fixed_s=max(0.0, iter_s - rows * ROW_SLOPE_S),
        iter_per_seq_s=ROW_SLOPE_S,
        iter_per_ctx_s=0.0,
        prefill_per_token_s=0.0,  # in the iteration cost it was measured with
        kv_capacity_tokens=10**9,
        train_fixed_s=train,  # every step trains the same samples: per step, not per token
        train_per_token_s=0.0,
        train_per_ctx_token_s=0.0,
        push_s=push,
        env_step_s=least("env_pool") / turns,
        env_open_s=0.0,
        validate_s=0.0,
        lengths=Lengths(
            agent_reply_median=float(w["turn_tokens"]),
            agent_reply_sigma=0.0,
            agent_turns_median=float(turns),
            agent_turns_sigma=0.0,
            prompt_tokens=64,
            obs_tokens=8,
            source="the workload's own: fixed turns and reply length (bench/pipeline.py)",
        ),
    )
