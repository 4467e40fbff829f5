"""SandboxedEnv: a sandboxed environment as a gymnasium.Env that passes check_env."""

from __future__ import annotations

import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from spade_async.envs.gym import SandboxedEnv
from spade_async.envs.pool import EnvError

SOURCE = r'''
import random, re

class LockEnv:
    """Open a 3-digit lock; each guess says how many digits are right. Unicode: é→"""
    def __init__(self, max_turns=20, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code, self.turn = [rng.randint(0, 9) for _ in range(3)], 0
        return "Guess the code as \\boxed{ddd}. é→", {"digits": 3}
    def step(self, action):
        self.turn += 1
        m = re.search(r"\\boxed\{(\d{3})\}", action)
        if not m:
            return "Format: \\boxed{ddd}", 0.0, False, self.turn >= self.max_turns, {}
        right = sum(int(c) == d for c, d in zip(m.group(1), self.code))
        done = right == 3
        return f"{right} right", 1.0 if done else right / 4, done, self.turn >= self.max_turns, {}
    def solution(self):
        return ["\\boxed{000}", "\\boxed{" + "".join(map(str, self.code)) + "}"]
'''


@pytest.fixture
def env():
    e = SandboxedEnv(SOURCE)
    yield e
    e.close()


def test_check_env_passes(env):
    check_env(env, skip_render_check=True)
    assert isinstance(env.observation_space, spaces.Text)
    assert isinstance(env.action_space, spaces.Text)


def test_episode_and_charset(env):
    obs, info = env.reset(seed=5)
    assert obs.endswith("{ddd}. ??")  # characters outside the charset become "?"
    assert obs in env.observation_space and info == {"digits": 3}
    for action in env.solution():
        obs, reward, terminated, truncated, _ = env.step(action)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert env.env_class == "LockEnv" and env.isolation


def test_broken_source_raises_env_error():
    with pytest.raises(EnvError) as err:
        SandboxedEnv("class Nothing:\n    pass\n")
    assert err.value.kind == "structure"
