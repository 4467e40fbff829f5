"""Roles whose output is not a chain of thought render with thinking off, and a <think>
block never reaches a hint, an environment or the designer's extracted code."""

from __future__ import annotations

import anyio
import pytest
from transformers import AutoTokenizer

from spade_async.envs.pool import EnvError
from spade_async.generation.chat import strip_think
from spade_async.generation.client import GenerateResult
from spade_async.roles.agent import EnvRef
from spade_async.roles.hint import HintConfig, write_hint
from spade_async.roles.services import Services

# Qwen3's generation prompt: an empty think block when enable_thinking is false
QWEN3_GEN = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("<think>\nthe code is 1234\n</think>\n\nTry small digits first.", "Try small digits first."),
        ("Plain answer.", "Plain answer."),
        ("reasoning the template opened</think>\nanswer", "answer"),  # Qwen3 opens it itself
        ("<think>cut off by the length limit", ""),
        ("a<think>x</think>b<think>y</think>c", "abc"),
    ],
)
def test_strip_think(text, want):
    assert strip_think(text) == want


class _Client:
    def __init__(self, reply: str) -> None:
        self.reply, self.prompts = reply, []

    async def generate(self, ids, sampling, **kw):
        self.prompts.append(list(ids))
        return GenerateResult(output_ids=[1], logprobs=[], finish_reason="stop", matched=None,
                              text=self.reply, weight_version="0", prompt_tokens=len(ids),
                              url="fake")


class _NoEnvPool:
    async def open(self, *a, **kw):
        raise EnvError("boot", "no sandbox in this test")


@pytest.fixture(scope="module")
def qwen3_tok(tokenizer_path, tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    tok.chat_template = QWEN3_GEN
    folder = tmp_path_factory.mktemp("qwen3_gen_tok")
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_hint_writer_renders_thinking_off_and_strips_think(qwen3_tok):
    client = _Client("<think>\nthe secret is 42\n</think>\n\nCount the moves before acting.")
    res = anyio.run(lambda: write_hint(Services(client, _NoEnvPool(), qwen3_tok),
                                       env=EnvRef(env_id="e", source="class Env: ..."), seed=0,
                                       cfg=HintConfig()))
    assert res.hint == "Count the moves before acting."
    prompt = qwen3_tok.decode(client.prompts[0])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


class _Pool:
    def __init__(self) -> None:
        self.actions: list[str] = []

    async def open(self, source, env_id=None):
        return "inst"

    async def reset(self, inst, seed):
        return "Guess the number.", {}

    async def step(self, inst, action):
        self.actions.append(action)
        return "", 1.0, True, False, {}

    async def close(self, inst):
        pass


class _AgentClient:
    def __init__(self, tok, text: str) -> None:
        self.tok, self.text = tok, text

    async def generate(self, ids, sampling, **kw):
        out = self.tok(self.text, add_special_tokens=False).input_ids
        return GenerateResult(output_ids=out, logprobs=[-0.1] * len(out), finish_reason="stop",
                              matched=None, text=self.text, weight_version="6",
                              policy_version="5", prompt_tokens=len(ids), url="fake")

    def end_session(self, key):
        pass


def test_agent_steps_the_environment_without_its_reasoning(qwen3_tok):
    from spade_async.roles.agent import AgentConfig, play_episode

    text = "<think>\nmaybe 7, or \\boxed{3}\n</think>\n\n\\boxed{7}"
    pool = _Pool()
    ep = anyio.run(lambda: play_episode(
        Services(_AgentClient(qwen3_tok, text), pool, qwen3_tok),
        env=EnvRef(env_id="e", source="class Env: ..."), seed=0, hint=None,
        cfg=AgentConfig(), version=9))
    assert pool.actions == ["\\boxed{7}"]
    assert ep.turn_versions == [5]  # the engine's oldest weights behind the turn, not 9 or 6
    assert "<think>" in qwen3_tok.decode(ep.token_ids)  # the trained tokens keep it
