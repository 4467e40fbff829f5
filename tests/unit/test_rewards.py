"""Rewards and advantages from hand-worked numbers (docs/method.md formulas)."""

import math

import pytest

from spade_async.rewards import (
    RewardConfig,
    agent_outcome,
    check,
    designer_advantages,
    designer_reward,
    grpo_advantages,
    matched_regret,
    plateau,
    regret,
    role_balance_scale,
    win_rate,
    wins,
)

CFG = RewardConfig()


def test_agent_outcome_clips_and_scores_timeouts():
    assert agent_outcome(3.0, True) == 1.0
    assert agent_outcome(-2.0, True) == -1.0
    assert agent_outcome(0.7, False) == 0.0  # not terminated: outcome-only reward is 0
    assert agent_outcome(0.4, True) == 0.4
    assert agent_outcome(1.0, True, timed_out=True) == -0.5
    assert agent_outcome(1.0, True, timed_out=True, timeout_reward=-0.25) == -0.25
    assert agent_outcome(float("nan"), True) == 0.0


def test_regret_is_floored_at_zero():
    assert regret([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.25)
    assert regret([0.2], [0.5]) == 0.0
    assert regret([], [1.0]) == 0.0


@pytest.mark.parametrize(
    "rate, expected",
    [
        (0.5, 1.0),
        (0.4, 1.0),
        (0.6, 1.0),
        (0.3, 0.6),
        (0.7, 0.6),
        (0.2, 0.2),
        (0.15, 0.0),
        (0.95, 0.0),
    ],
)
def test_plateau(rate, expected):
    assert plateau(rate, CFG) == pytest.approx(expected)


def test_blend_default():
    # 0.4 * clip(0.075 / 0.15) + 0.6 * plateau(0.3) = 0.4 * 0.5 + 0.6 * 0.6
    assert designer_reward(CFG, regret_value=0.075, nohint_win_rate=0.3) == pytest.approx(0.56)
    # regret above the scale saturates at 1
    assert designer_reward(CFG, regret_value=0.9, nohint_win_rate=0.5) == pytest.approx(1.0)


def test_blend_without_regret_floor_can_go_negative():
    cfg = RewardConfig(regret_floor=False)
    # 0.4 * (-0.3 / 0.15) + 0.6 * plateau(0.5) = -0.8 + 0.6 = -0.2
    assert designer_reward(cfg, regret_value=-0.3, nohint_win_rate=0.5) == pytest.approx(-0.2)
    assert designer_reward(CFG, regret_value=-0.3, nohint_win_rate=0.5) == pytest.approx(0.6)


def test_other_variants():
    r = RewardConfig(variant="regret")  # the reference's: unscaled, floored at 0
    assert designer_reward(r, regret_value=0.03, nohint_win_rate=0.0) == pytest.approx(0.03)
    assert designer_reward(r, regret_value=-0.2, nohint_win_rate=0.0) == 0.0
    s = RewardConfig(variant="solve_rate")
    assert designer_reward(s, regret_value=1.0, nohint_win_rate=0.7) == pytest.approx(0.6)
    lp = RewardConfig(variant="learning_potential")
    assert designer_reward(
        lp, regret_value=0, nohint_win_rate=0.6, slow_ema_win_rate=0.4
    ) == pytest.approx(0.2)
    v = RewardConfig(variant="variance")
    assert designer_reward(
        v, regret_value=0, nohint_win_rate=0.5, nohint_rewards=[1, 0, 1, 0]
    ) == pytest.approx(1.0)
    assert designer_reward(
        v, regret_value=0, nohint_win_rate=1.0, nohint_rewards=[1, 1, 1, 1]
    ) == pytest.approx(math.exp(-0.0625 / 0.02))


def test_masked_samples_leave_the_skill_mean_before_centring():
    # skill a: values 0.9, 0.3 and -0.4 (masked). The mask is decided first, so the mean is
    # (0.9 + 0.3) / 2 = 0.6, not (0.9 + 0.3 - 0.4) / 3 = 0.2667.
    # skill b: one sample, 0.8 -> advantage 0.
    cfg = RewardConfig(variant="regret")
    rewards, adv, keep = designer_advantages(
        cfg, [0.9, 0.3, -0.4, 0.8], ["a", "a", "a", "b"], duplicate=[False] * 4
    )
    assert keep == [True, True, False, True]
    assert adv == pytest.approx([0.3, -0.3, 0.0, 0.0])
    assert rewards == pytest.approx([0.9, 0.3, -0.4, 0.8])
    # with masking off the negative one stays and moves the mean to 0.2667
    _, adv, keep = designer_advantages(
        RewardConfig(mask_negative=False), [0.9, 0.3, -0.4], ["a"] * 3, duplicate=[False] * 3
    )
    assert all(keep)
    assert adv == pytest.approx([0.9 - 0.8 / 3, 0.3 - 0.8 / 3, -0.4 - 0.8 / 3])


def test_duplicate_penalty_is_a_learning_signal():
    # blend values 0.9, 0.3 and a near-duplicate worth 0.3 before its 0.5 penalty -> -0.2.
    # Masking looks at the value (0.3 >= 0), so the duplicate stays: mean (0.9 + 0.3 - 0.2) / 3
    # = 1/3, advantages 0.5667, -0.0333, -0.5333 -- the duplicate is pushed down hardest.
    rewards, adv, keep = designer_advantages(
        CFG, [0.9, 0.3, 0.3], ["a"] * 3, duplicate=[False, False, True]
    )
    assert keep == [True, True, True]
    assert rewards == pytest.approx([0.9, 0.3, -0.2])
    assert adv == pytest.approx([0.9 - 1 / 3, 0.3 - 1 / 3, -0.2 - 1 / 3])
    assert adv[2] < 0


def test_environment_fault_is_penalised_and_never_masked():
    # None = the environment crashed or timed out: reward env_fault_reward (-0.5), kept.
    # mean (0.7 + 0.0 - 0.5) / 3 = 0.0667
    rewards, adv, keep = designer_advantages(
        CFG, [0.7, 0.0, None], ["a"] * 3, duplicate=[False] * 3
    )
    assert keep == [True, True, True]
    assert rewards == pytest.approx([0.7, 0.0, -0.5])
    assert adv == pytest.approx([0.7 - 0.2 / 3, -0.2 / 3, -0.5 - 0.2 / 3])


def test_win_rate_is_mean_raw_reward_by_default():
    plays = [1.0, 0.5, 0.5, 0.0]  # partial rewards count partly: mean 0.5
    assert win_rate(plays, 1.0, RewardConfig().win_rate) == pytest.approx(0.5)
    assert win_rate(plays, 1.0, "threshold") == pytest.approx(0.25)  # only the 1.0 is a win
    assert wins(plays, 1.0, "mean") == pytest.approx(2.0)
    assert wins(plays, 1.0, "threshold") == pytest.approx(1.0)
    # blend on that environment: regret 0, plateau(0.5) = 1 -> 0.6 (threshold: plateau(0.25)
    # = 1 - 0.15 / 0.25 = 0.4 -> 0.24)
    assert designer_reward(CFG, regret_value=0.0, nohint_win_rate=0.5) == pytest.approx(0.6)
    assert designer_reward(CFG, regret_value=0.0, nohint_win_rate=0.25) == pytest.approx(0.24)


def test_matched_regret_pairs_hinted_plays_with_same_version_plain_plays():
    # hinted at version 3: mean 0.75. Plain at version 3: mean 0.25; at version 4 the agent
    # improved to 1.0, which must not shrink the regret: 0.75 - 0.25 = 0.5 (flattened: 0.125)
    hint = [(3, 1.0), (3, 0.5)]
    plain = [(3, 0.5), (3, 0.0), (4, 1.0), (4, 1.0)]
    assert matched_regret(hint, plain) == pytest.approx(0.5)
    assert matched_regret([(3, 0.0)], plain) == pytest.approx(-0.25)  # signed: variants floor it
    assert regret([1.0, 0.5], [0.5, 0.0, 1.0, 1.0]) == pytest.approx(0.125)
    assert matched_regret([], plain) == 0.0
    assert matched_regret(hint, [(4, 1.0)]) == 0.0  # no same-policy plain play: no regret


def test_check_forbids_regret_without_hints():
    msg = check(RewardConfig(variant="regret"), hints=False, designer_train=True)
    assert msg is not None and "hint" in msg and "\n" not in msg
    assert check(RewardConfig(variant="regret"), hints=True, designer_train=True) is None
    assert check(RewardConfig(), hints=False, designer_train=True) is None  # blend: plateau only
    assert check(RewardConfig(env_fault_reward=0.5), hints=True, designer_train=True)


def test_role_balance_scale():
    assert role_balance_scale(192, 24, 4) == 32
    assert role_balance_scale(1000, 10, 4) == 50
    assert role_balance_scale(5, 0, 4) == 0.0


def test_grpo_advantages():
    assert grpo_advantages([1, 0, 1, 0]) == pytest.approx([1, -1, 1, -1], abs=1e-5)
    assert grpo_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert grpo_advantages([0.5]) == [0.0]
    assert win_rate([1, 0, 1, 0.5]) == 0.5


def test_regret_variant_without_hints_fails_at_start_with_one_line():
    from spade_async.errors import ConfigError
    from spade_async.recipe import load

    with pytest.raises(ConfigError) as exc:
        load(None, ["rewards.variant=regret", "hint.enabled=false"])
    assert "rewards.variant = 'regret' needs hints" in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError):
        load(None, ["rewards.variant=regret", "agent.plays_hint=0"])
    load(None, ["rewards.variant=regret"])  # with hints: fine
