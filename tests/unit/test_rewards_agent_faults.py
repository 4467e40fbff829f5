"""An environment that times out or crashes mid-episode: the agent's reward and status."""

import anyio
import pytest

from spade_async.envs.process import EnvError
from spade_async.generation.client import GenerateResult
from spade_async.roles.agent import AgentConfig, EnvRef, play_episode
from spade_async.roles.services import Services


class _Client:
    async def generate(self, input_ids, sampling, **kw):
        return GenerateResult(
            output_ids=[5, 6],
            logprobs=[-0.1, -0.2],
            finish_reason="stop",
            matched=None,
            text="\\boxed{go}",
            weight_version="3",
            prompt_tokens=len(input_ids),
            url="fake",
        )

    def end_session(self, key):
        pass


class _Pool:
    def __init__(self, kind):
        self.kind = kind

    async def open(self, source, env_id):
        return object()

    async def reset(self, inst, seed):
        return "You are in a maze.", {}

    async def step(self, inst, action):
        raise EnvError(self.kind, "the environment failed")

    async def close(self, inst):
        pass


@pytest.mark.parametrize(
    "kind, status, reward", [("timeout", "timeout", -0.25), ("crash", "env_error", 0.0)]
)
def test_timeout_scores_the_configured_reward_and_crash_is_an_env_error(
    tokenizer_path, kind, status, reward
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)

    async def main():
        return await play_episode(
            Services(_Client(), _Pool(kind), tok),
            env=EnvRef("e", "class E: ..."),
            seed=0,
            hint=None,
            cfg=AgentConfig(),
            version=3,
            timeout_reward=-0.25,  # rewards.timeout_reward, passed by cycle.play
        )

    ep = anyio.run(main)
    assert (ep.status, ep.reward, ep.turns) == (status, reward, 1)
