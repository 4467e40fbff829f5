"""One hand-worked SPADE step against the reference's formulas (``spare_rollout.py``).

Two environments, 8 no-hint plays each; e2 is a zero-variance group (every play lost); the
second designer sample is a broken first attempt whose retry produced e2 (and that retry
is a near-duplicate). The reference keeps every actor trajectory in the batch (zero
advantages too), divides the sample-mean loss by the real samples of the step, and scales
the designer by ``compute_env_reward_scale`` = min(n_actor / n_env * regen_interval, 50)
with n_actor = every actor trajectory of the step. Its loss weight of a sample is therefore
advantage / n_real. Computed here by hand in float64 and compared with what
``cycle.step_batch`` sends to the trainer (advantage / Batch.loss_normaliser)."""

import math
from types import SimpleNamespace

import anyio
import pytest

from spade_async.envs.validate import Verdict
from spade_async.loop import cycle
from spade_async.recipe import load
from spade_async.roles.agent import Episode
from spade_async.roles.designer import DesignSample


class _Writer:
    async def update_stats(self, env_id, **kw):
        pass


class _Meters:
    def __init__(self):
        self.counts = {}

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n


def _ep(env, reward, *, hinted=False):
    return Episode(
        env_id=env,
        seed=0,
        hinted=hinted,
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.5],
        turn_spans=[(1, 3)],
        turn_versions=[5],
        reward=reward,
        status="terminated",
        turns=1,
        messages=[],
    )


def _ds(env_id, *, valid, retries=0, duplicate=False):
    return DesignSample(
        prompt_ids=[7, 8],
        output_ids=[9, 10, 11],
        logprobs=[-0.1, -0.2, -0.3],
        skill="A",
        doc_id=None,
        version=5,
        verdict=Verdict(valid=valid, stage="ok" if valid else "runtime", reason=""),
        env_id=env_id,
        duplicate=duplicate,
        retries=retries,
    )


E1 = (1, 0, 1, 0, 1, 0, 0, 0)  # win rate 3/8
HINT_E1 = (1, 1, 1, 0)  # R(hint) 0.75


def _step(**overrides):
    cfg = load(None, [f"{k}={v}" for k, v in {"regen_interval": 4, **overrides}.items()])
    rt = SimpleNamespace(
        cfg=cfg,
        state=SimpleNamespace(version=5, step=0, skill_ema={}),
        writer=_Writer(),
        meters=_Meters(),
    )
    window = cycle.Window(
        samples=[
            _ds("e1", valid=True),
            # broken first attempt (trained), its retry became e2, a near-duplicate
            _ds("e2", valid=False, retries=1, duplicate=True),
        ]
    )
    eps = [_ep("e1", r) for r in E1] + [_ep("e2", 0.0) for _ in range(8)]
    eps += [_ep("e1", r, hinted=True) for r in HINT_E1]

    async def go():
        await cycle.score(rt, eps, window)
        return await cycle.step_batch(rt, eps, window, window_ends=True)

    return anyio.run(go)


def test_hand_worked_step_matches_the_reference_formulas():
    batch = _step()
    # --- the reference, by hand ---
    n_actor = 16  # every actor trajectory: e2's zero-advantage plays count
    n_env = 2
    scale = min(n_actor / n_env * 4, 50.0)  # compute_env_reward_scale: 32
    mean = 3 / 8
    std = math.sqrt(sum((r - mean) ** 2 for r in E1) / 8)
    agent_adv = [(r - mean) / (std + 1e-6) for r in E1] + [0.0] * 8
    regret = sum(HINT_E1) / 4 - mean  # matched timing: 0.375
    r_term = min(1.0, max(0.0, regret / 0.15))
    plateau = 1 - (0.4 - mean) / 0.25  # win rate 0.375 sits 0.025 below the plateau
    blend1 = 0.4 * r_term + 0.6 * plateau  # 0.94
    blend2 = 0.0  # broken first attempt: 0, never the retry's duplicate penalty
    skill_mean = (blend1 + blend2) / 2
    designer_adv = [(blend1 - skill_mean) * scale, (blend2 - skill_mean) * scale]
    n_real = n_actor + n_env  # global batch 0 here: no trim, no padding
    want = {
        "designer": [a / n_real for a in designer_adv],
        "agent": [a / n_real for a in agent_adv],
    }
    # --- ours ---
    assert batch.normaliser == n_real
    assert batch.zero_advantage == 8
    got = {
        role: [s.advantage / batch.normaliser for s in batch.samples if s.role == role]
        for role in ("designer", "agent")
    }
    assert [s.role for s in batch.samples[:2]] == ["designer", "designer"]  # designer first
    # float64 on both sides, a handful of operations on O(1) numbers: 1e-12 is ~1e4 ulps
    assert got["designer"] == pytest.approx(want["designer"], rel=1e-12, abs=1e-15)
    assert got["agent"] == pytest.approx(want["agent"], rel=1e-12, abs=1e-15)
    assert designer_adv == pytest.approx([0.47 * 32, -0.47 * 32], rel=1e-12)


def test_with_the_reference_trim_and_kl_a_short_batch_divides_by_the_global_batch():
    # kl on (8B recipe): the reference pads a short batch to 192 and does not rescale
    batch = _step(batch_samples=192, **{"trainer.kl_coef": 0.005})
    assert len(batch.samples) == 18 and batch.normaliser == 192
    # a global batch smaller than the step: the trim sheds agent samples, never the designer's
    batch = _step(batch_samples=10)
    roles = [s.role for s in batch.samples]
    assert roles == ["designer"] * 2 + ["agent"] * 8 and batch.normaliser == 10
