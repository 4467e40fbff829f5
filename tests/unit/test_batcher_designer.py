"""designer_batch and the batcher on hand-worked numbers: one regeneration window through
``cycle.score`` -> ``cycle.designer_batch`` / ``batcher.agent_samples``, with a fake runtime
(memory writer, meters, run state) and the real config defaults (blend 0.4 / 0.6, regret
scale 0.15, plateau [0.4, 0.6] ramp 0.25, win rate = mean raw reward, duplicate penalty 0.5,
fault reward -0.5, regen_interval 4)."""

import math
from types import SimpleNamespace

import anyio
import pytest

from spade_async.envs.validate import Verdict
from spade_async.loop import cycle
from spade_async.loop.batcher import agent_samples
from spade_async.recipe import load
from spade_async.roles.agent import Episode
from spade_async.roles.designer import DesignSample


class _Writer:
    def __init__(self):
        self.stats = []

    async def update_stats(self, env_id, **kw):
        self.stats.append((env_id, kw))


class _Meters:
    def __init__(self):
        self.counts = {}

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n


def _rt(**overrides):
    cfg = load(None, [f"{k}={v}" for k, v in overrides.items()])
    state = SimpleNamespace(version=5, step=0, skill_ema={})
    return SimpleNamespace(cfg=cfg, state=state, writer=_Writer(), meters=_Meters())


def _ep(env, reward, *, hinted=False, version=5, status="terminated"):
    return Episode(
        env_id=env,
        seed=0,
        hinted=hinted,
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.5],
        turn_spans=[(1, 3)],
        turn_versions=[version],
        reward=reward,
        status=status,
        turns=1,
        messages=[],
    )


def _ds(skill, env_id, *, valid=True, duplicate=False):
    return DesignSample(
        prompt_ids=[7, 8],
        output_ids=[9, 10, 11],
        logprobs=[-0.1, -0.2, -0.3],
        skill=skill,
        doc_id=None,
        version=5,
        verdict=Verdict(valid=valid, stage="ok" if valid else "syntax", reason=""),
        env_id=env_id if valid else None,
        duplicate=duplicate,
    )


def _window_plays():
    """Two steps of plays (policy v5 = regeneration, v6 the next step)."""
    step5 = [
        # e1: hinted 0.75; plain at v5 0.25 -> matched regret 0.5
        *[_ep("e1", r, hinted=True) for r in (1, 1, 1, 0)],
        *[_ep("e1", r) for r in (0.5, 0.0, 0.5, 0.0)],
        # e2: nothing solved, with or without the hint
        *[_ep("e2", 0.0, hinted=True) for _ in range(2)],
        *[_ep("e2", 0.0) for _ in range(2)],
        # e3 (a near-duplicate): hinted 1.0, plain 0.5 -> regret 0.5, win rate 0.5
        *[_ep("e3", 1.0, hinted=True) for _ in range(2)],
        *[_ep("e3", r) for r in (1, 0, 1, 0)],
        # e4: one play crashed, one timed out -> the environment's fault
        _ep("e4", 1.0),
        _ep("e4", 0.0),
        _ep("e4", -0.5, status="timeout"),
        _ep("e4", 0.0, status="env_error"),
        # e5: always solved without the hint -> plateau 0, regret 0
        *[_ep("e5", 1.0, hinted=True) for _ in range(2)],
        *[_ep("e5", 1.0) for _ in range(4)],
    ]
    step6 = [
        *[_ep("e1", r, version=6) for r in (1.0, 0.0, 1.0, 0.0)],  # the agent improved
        *[_ep("e2", 0.0, version=6) for _ in range(2)],
    ]
    return step5, step6


def _window():
    samples = [
        _ds("A", "e1"),
        _ds("A", "e2"),
        _ds("A", None, valid=False),  # broken first attempt: reward 0
        _ds("A", "e3", duplicate=True),
        _ds("B", "e4"),
        _ds("B", "e5"),
        _ds("B", "e6"),  # valid, but none of its plays reached the trainer: unscored
    ]
    return cycle.Window(samples=samples)


def test_designer_batch_window_regret_blend_centring_and_scale():
    rt, window = _rt(**{"rewards.fault_penalty": "always"}), _window()
    step5, step6 = _window_plays()

    async def main():
        await cycle.score(rt, step5, window)
        await cycle.score(rt, step6, window)
        return await cycle.designer_batch(rt, window, n_agent=36)

    samples, mean = anyio.run(main)
    # e1: regret 0.75 - 0.25 = 0.5 -> 0.4 * 1; win rate (1 + 2) / 8 = 0.375 ->
    #     plateau 1 - 0.025 / 0.25 = 0.9 -> 0.6 * 0.9 = 0.54; value 0.94
    # e2: 0; broken: 0; e3: 0.4 + 0.6 * 1 = 1.0 - 0.5 duplicate = 0.5
    # skill A mean (0.94 + 0 + 0 + 0.5) / 4 = 0.36 -> advantages 0.58, -0.36, -0.36, 0.14
    # e4: fault -0.5; e5: win rate 1 -> plateau 0, regret 0 -> 0; skill B mean -0.25
    # role-balance scale: 36 agent samples / 6 scored designer samples * 4 = 24
    expected = [0.58, -0.36, -0.36, 0.14, -0.25, 0.25]
    assert [s.advantage for s in samples] == pytest.approx([24 * a for a in expected])
    assert all(s.role == "designer" and s.loss_mask == [0, 0, 1, 1, 1] for s in samples)
    assert mean == pytest.approx((0.94 + 0.5 - 0.5) / 6)
    assert rt.meters.counts["designer/unscored"] == 1
    assert rt.meters.counts["designer/masked"] == 0
    rewards = {e: kw["designer_reward"] for e, kw in rt.writer.stats if "designer_reward" in kw}
    assert rewards == pytest.approx({"e1": 0.94, "e2": 0.0, "e3": 0.5, "e4": -0.5, "e5": 0.0})
    assert rt.state.skill_ema == {}  # only the learning-potential variant keeps a baseline


def _scored(**overrides):
    rt, window = _rt(**overrides), _window()
    step5, step6 = _window_plays()
    anyio.run(cycle.score, rt, step5, window)
    anyio.run(cycle.score, rt, step6, window)
    scored, rewards, _, _ = cycle.score_designs(rt, window)
    return rt, {
        s.env_id if s.verdict.valid else "broken": r for s, r in zip(scored, rewards, strict=True)
    }


def test_reference_fault_penalty_blend_scores_the_plays_that_completed():
    # e4 (blend, fault_penalty 'reference'): its timeout and crash are no plays; the two that
    # completed (1, 0) give win rate 0.5 -> plateau 1 -> 0.6; no hinted play -> regret 0
    _, rewards = _scored()
    assert rewards["e4"] == pytest.approx(0.6)


def test_regret_variant_is_unscaled_over_every_window_play_and_penalises_timeouts():
    # recompute_delayed_env_rewards_regret: max(0, R_hint - mean of all no-hint plays)
    # e1: 0.75 - (0.5 + 0 + 0.5 + 0 + 1 + 0 + 1 + 0) / 8 = 0.375 (matched timing gave 0.5)
    # e3: 1.0 - 0.5 = 0.5 - duplicate 0.5 = 0; e5: 1 - 1 = 0; e4: a step timeout -> -0.5
    _, rewards = _scored(**{"rewards.variant": "regret"})
    assert rewards == pytest.approx(
        {"e1": 0.375, "e2": 0.0, "broken": 0.0, "e3": 0.0, "e4": -0.5, "e5": 0.0}
    )


def test_learning_potential_moves_the_slow_baseline_first_with_pooled_plays():
    # first window: mu_slow = the pooled mean of skill A's no-hint plays: e1 3/8 over 8
    # plays, e2 0 over 4, e3 2/4 -> (3 + 0 + 2) / 16 = 0.3125; value |rate - 0.3125|
    rt, rewards = _scored(**{"rewards.variant": "learning_potential"})
    assert rt.state.skill_ema["A"] == pytest.approx(5 / 16)
    assert rewards["e1"] == pytest.approx(0.375 - 0.3125)
    assert rewards["e2"] == pytest.approx(0.3125)
    # a second window: (1 - 0.85) * 0.3125 + 0.85 * new, before scoring
    from spade_async.rewards import slow_baseline

    assert slow_baseline(0.3125, 1.0, 0.85) == pytest.approx(0.15 * 0.3125 + 0.85)


def test_designer_batch_every_step_regret_and_threshold_win_rate():
    # every_step pairs the hinted plays with same-version plain plays too: same regret here;
    # the threshold win rate makes e1's rate 2/8 = 0.25 -> plateau 0.4 -> 0.4 + 0.24 = 0.64
    rt, window = _rt(**{"rewards.win_rate": "threshold"}), _window()
    step5, step6 = _window_plays()

    async def main():
        await cycle.score(rt, step5, window)
        await cycle.score(rt, step6, window)
        return await cycle.designer_batch(rt, window, n_agent=36)

    anyio.run(main)
    rewards = {e: kw["designer_reward"] for e, kw in rt.writer.stats if "designer_reward" in kw}
    # e3 threshold rate 0.5 -> 1.0 - 0.5 = 0.5 as before
    assert rewards["e1"] == pytest.approx(0.64) and rewards["e3"] == pytest.approx(0.5)


def test_designer_masking_in_a_window_excludes_the_sample_from_centring():
    # regret_floor off: e8's hint hurt (hinted 0.0, plain 0.5 -> regret -0.5), so its blend
    # is 0.4 * (-0.5 / 0.15) + 0.6 * plateau(0.5) = -1.3333 + 0.6 = -0.7333 < 0: masked.
    # e1 over step 5 only: regret 0.5 unclipped -> 0.4 * 0.5 / 0.15 = 1.3333, win rate 0.25
    # -> plateau 0.4 -> 0.24: 1.5733; e2: 0. Skill mean over the kept two = 0.7867 ->
    # advantages +-0.7867 (with e8 in the mean it would be 0.28)
    rt = _rt(**{"rewards.regret_floor": "false"})
    window = cycle.Window(samples=[_ds("A", "e1"), _ds("A", "e2"), _ds("A", "e8")])
    step5, _ = _window_plays()
    step5 += [_ep("e8", 0.0, hinted=True) for _ in range(2)]
    step5 += [_ep("e8", r) for r in (1, 0, 1, 0)]
    anyio.run(cycle.score, rt, step5, window)
    scored, rewards, adv, keep = cycle.score_designs(rt, window)
    assert keep == [True, True, False]
    e1 = 0.4 * 0.5 / 0.15 + 0.24
    assert rewards == pytest.approx([e1, 0.0, -0.4 / 0.15 * 0.5 + 0.6])
    assert adv == pytest.approx([e1 / 2, -e1 / 2, 0.0])
    samples, _ = anyio.run(cycle.designer_batch, rt, window, 6)
    # scale 6 / 3 * 4 = 8; the masked sample never reaches the trainer
    assert [s.advantage for s in samples] == pytest.approx([e1 / 2 * 8, -e1 / 2 * 8])


def test_agent_advantages_reach_the_trainer_without_env_errors():
    rt = _rt()
    step5, step6 = _window_plays()
    eps = step5 + step6

    def advs(env):
        samples, _ = agent_samples([e for e in eps if e.env_id == env], rt.cfg.agent)
        return [s.advantage for s in samples]

    # e1 no-hint group (the two steps together): rewards .5 0 .5 0 1 0 1 0, mean 0.375,
    # population std sqrt(2.5 / 8 - 0.375^2) = sqrt(0.171875); hinted plays are not trained
    std = math.sqrt(0.171875)
    assert advs("e1") == pytest.approx(
        [(r - 0.375) / (std + 1e-6) for r in (0.5, 0, 0.5, 0, 1, 0, 1, 0)]
    )
    # e4: the env_error play left the group; the timeout stays at -0.5: rewards 1, 0, -0.5
    m4 = 0.5 / 3
    s4 = math.sqrt(sum((r - m4) ** 2 for r in (1, 0, -0.5)) / 3)
    assert advs("e4") == pytest.approx([(r - m4) / (s4 + 1e-6) for r in (1, 0, -0.5)])
    # all-equal groups: advantage 0, and the samples stay in the batch (the reference's)
    assert advs("e2") == [0.0] * 4 and advs("e5") == [0.0] * 4
    samples, zero = agent_samples(eps, rt.cfg.agent)
    assert len(samples) == 8 + 4 + 4 + 3 + 4 and zero == 4 + 4  # e2, e5: zero advantage


@pytest.mark.parametrize("mode, later_rounds_hinted", [("regen", False), ("every_step", True)])
def test_hints_written_once_per_window_and_played_per_regret_plays(
    monkeypatch, mode, later_rounds_hinted
):
    from spade_async.roles.agent import EnvRef

    written = []

    async def fake_hints_for(rt, envs):
        written.extend(e.env_id for e in envs)
        return {e.env_id: f"hint for {e.env_id}" for e in envs}

    monkeypatch.setattr(cycle, "hints_for", fake_hints_for)
    rt, window = _rt(**{"rewards.regret_plays": mode}), cycle.Window()
    envs = [EnvRef("e1", ""), EnvRef("e2", "")]

    async def main():
        first = dict(await cycle.window_hints(rt, window, envs, fresh=True))
        later = dict(await cycle.window_hints(rt, window, envs + [EnvRef("e3", "")], fresh=False))
        return first, later

    first, later = anyio.run(main)
    assert first == {"e1": "hint for e1", "e2": "hint for e2"}
    assert bool(later) is later_rounds_hinted
    # each environment's hint is written once per window, whichever schedule asks
    assert written == (["e1", "e2", "e3"] if later_rounds_hinted else ["e1", "e2"])
