"""The BFCL multi-turn episode as a sandboxed environment, on bfcl-eval's own code.

Our own environment code (not model-written); it imports ``bfcl_eval``, which its pool binds
read-only into the workers (``PoolConfig.packages``, as reasoning-gym's pool does). Model
calls arrive as the call strings QwenFCHandler decodes (``bfcl_lib.decode_execute``) and run
through bfcl-eval's ``execute_multi_turn_func_call``, which ``eval``s them against its API
classes: that is why they run here only, one fresh worker per episode. The verdict is
bfcl-eval's ``multi_turn_checker`` on every turn's decoded calls (it replays them on fresh
instances beside the ground truth: state check, response check, empty-turn check).

step(``{"execute": [calls]}``) -> the execution results (JSON list of strings);
step(``{"check": [[[calls] per step] per turn]}``) -> reward 1.0 / 0.0, episode ends,
``info["failure"]`` = the checker's error_type.
"""

from __future__ import annotations

__all__ = ["SOURCE", "PACKAGES"]

PACKAGES = ("bfcl-eval",)  # and its installed requirements (mpmath for MathAPI)

SOURCE = r"""
import json
import os

# bfcl_eval makes folders under BFCL_PROJECT_ROOT when some modules import: the worker's tmp
os.environ["BFCL_PROJECT_ROOT"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "bfcl")

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call


class BfclEpisodeEnv:
    def __init__(self, entry=None, model="spade", max_turns=1, **kwargs):
        self.entry = entry or {"id": "multi_turn_base_0", "initial_config": {},
                               "involved_classes": [], "ground_truth": [[]]}
        self.model = model
        category = self.entry["id"].rsplit("_", 1)[0]
        self.category = category
        self.long_context = "long_context" in category or "composite" in category

    def _execute(self, calls):
        e = self.entry
        results, _ = execute_multi_turn_func_call(
            calls, e["initial_config"], e["involved_classes"], self.model, e["id"],
            long_context=self.long_context, is_evaL_run=False,
        )
        return results

    def reset(self, seed=None):
        self._execute([])  # the instances, loaded with the entry's initial config
        return "ready", {}

    def step(self, action):
        msg = json.loads(action)
        if "execute" in msg:
            return json.dumps(self._execute(msg["execute"])), 0.0, False, False, {}
        e = self.entry
        verdict = multi_turn_checker(
            msg["check"], e["ground_truth"],
            {"initial_config": e["initial_config"], "involved_classes": e["involved_classes"],
             "id": e["id"]},
            self.category, self.model,
        )
        if verdict.get("valid"):
            return "valid", 1.0, True, False, {}
        failure = str(verdict.get("error_type", "invalid"))
        return failure, 0.0, True, False, {"failure": failure}

    def solution(self):
        return ""
"""
