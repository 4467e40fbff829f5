"""Rewards and advantages from hand-worked numbers (SPADE.md formulas)."""

import math

import pytest

from spade_async.rewards import (
    RewardConfig,
    agent_outcome,
    centre_per_skill,
    designer_reward,
    grpo_advantages,
    plateau,
    regret,
    role_balance_scale,
    win_rate,
)

CFG = RewardConfig()


def test_agent_outcome_clips_and_scores_timeouts():
    assert agent_outcome(3.0, True) == 1.0
    assert agent_outcome(-2.0, True) == -1.0
    assert agent_outcome(0.7, False) == 0.0  # not terminated: outcome-only reward is 0
    assert agent_outcome(0.4, True) == 0.4
    assert agent_outcome(1.0, True, timed_out=True) == -0.5
    assert agent_outcome(float("nan"), True) == 0.0


def test_regret_is_floored_at_zero():
    assert regret([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.25)
    assert regret([0.2], [0.5]) == 0.0
    assert regret([], [1.0]) == 0.0


@pytest.mark.parametrize(
    "rate, expected", [(0.5, 1.0), (0.4, 1.0), (0.6, 1.0), (0.3, 0.6), (0.7, 0.6), (0.2, 0.2), (0.15, 0.0), (0.95, 0.0)]
)
def test_plateau(rate, expected):
    assert plateau(rate, CFG) == pytest.approx(expected)


def test_blend_default():
    # 0.4 * clip(0.075 / 0.15) + 0.6 * plateau(0.3) = 0.4 * 0.5 + 0.6 * 0.6
    assert designer_reward(CFG, regret_value=0.075, nohint_win_rate=0.3) == pytest.approx(0.56)
    # regret above the scale saturates at 1
    assert designer_reward(CFG, regret_value=0.9, nohint_win_rate=0.5) == pytest.approx(1.0)


def test_other_variants():
    r = RewardConfig(variant="regret")
    assert designer_reward(r, regret_value=0.03, nohint_win_rate=0.0) == pytest.approx(0.2)
    s = RewardConfig(variant="solve_rate")
    assert designer_reward(s, regret_value=1.0, nohint_win_rate=0.7) == pytest.approx(0.6)
    lp = RewardConfig(variant="learning_potential")
    assert designer_reward(lp, regret_value=0, nohint_win_rate=0.6, slow_ema_win_rate=0.4) == pytest.approx(0.2)
    v = RewardConfig(variant="variance")
    assert designer_reward(v, regret_value=0, nohint_win_rate=0.5, nohint_rewards=[1, 0, 1, 0]) == pytest.approx(1.0)
    assert designer_reward(v, regret_value=0, nohint_win_rate=1.0, nohint_rewards=[1, 1, 1, 1]) == pytest.approx(
        math.exp(-0.0625 / 0.02)
    )


def test_duplicate_penalty_and_negative_mask():
    value = designer_reward(CFG, regret_value=0.0, nohint_win_rate=0.0, duplicate=True)
    assert value == pytest.approx(-0.5)
    adv, keep = centre_per_skill([0.5, 0.3, 0.8, value], ["a", "a", "b", "b"])
    assert adv[:2] == pytest.approx([0.1, -0.1])
    assert adv[2] == pytest.approx(0.8 - (0.8 - 0.5) / 2)
    assert keep == [True, True, True, False]


def test_role_balance_scale():
    assert role_balance_scale(192, 24, 4) == 32
    assert role_balance_scale(1000, 10, 4) == 50
    assert role_balance_scale(5, 0, 4) == 0.0


def test_grpo_advantages():
    assert grpo_advantages([1, 0, 1, 0]) == pytest.approx([1, -1, 1, -1], abs=1e-5)
    assert grpo_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert grpo_advantages([0.5]) == [0.0]
    assert win_rate([1, 0, 1, 0.5]) == 0.5
