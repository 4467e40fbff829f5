"""What one agent turn does, as the reference's ``orchestrator.play_game_async``: a reply
cut by the token budget (no EOS) ends the episode truncated with reward 0 and never
reaches ``step()``; ``step()`` receives ``parse_action`` of the visible reply; the request
carries the reference's sampling (top_p 0.95, top_k 20) and a turn budget of
min(max_turn_tokens, context left - 64)."""

import anyio
import pytest

from spade_async.generation.client import GenerateResult
from spade_async.roles.agent import AgentConfig, EnvRef, parse_action, play_episode
from spade_async.roles.services import Services


class _Client:
    def __init__(self, replies):
        self.replies = list(replies)  # (text, finish_reason)
        self.requests = []

    async def generate(self, input_ids, sampling, **kw):
        self.requests.append((len(input_ids), sampling))
        text, finish = self.replies.pop(0)
        return GenerateResult(
            output_ids=[5, 6, 7],
            logprobs=[-0.1, -0.2, -0.3],
            finish_reason=finish,
            matched=None,
            text=text,
            weight_version="3",
            prompt_tokens=len(input_ids),
            url="fake",
        )

    def end_session(self, key):
        pass


class _Pool:
    """A two-move game that records what step() received: 'go' twice wins 1.0."""

    def __init__(self):
        self.actions = []

    async def open(self, source, env_id):
        return object()

    async def reset(self, inst, seed):
        return "Say go.", {}

    async def step(self, inst, action):
        self.actions.append(action)
        done = len(self.actions) == 2
        return "again", 1.0 if done else 0.0, done, False, {}

    async def close(self, inst):
        pass


def _play(tokenizer_path, replies, **cfg):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    client, pool = _Client(replies), _Pool()

    async def main():
        return await play_episode(
            Services(client, pool, tok),
            env=EnvRef("e", "class E: ..."),
            seed=0,
            hint=None,
            cfg=AgentConfig(**cfg),
            version=3,
        )

    return anyio.run(main), client, pool


@pytest.mark.parametrize(
    "reply, action",
    [
        ("I think so. \\boxed{go} then", "\\boxed{go}"),
        ("\\boxed{a} or \\boxed{b}", "\\boxed{a}"),  # the first brace-free box
        ("\\boxed{{go}}", "\\boxed{go}"),
        ("\\boxed{f(\\{x\\})}", "\\boxed{f(\\{x\\})}"),  # nested braces: the balanced scan
        ("  no box at all  ", "no box at all"),
        ("\\boxed{}", "\\boxed{}"),  # an empty box boxes nothing: the stripped reply
    ],
)
def test_parse_action_is_the_references(reply, action):
    assert parse_action(reply) == action


def test_step_gets_the_parsed_visible_action(tokenizer_path):
    replies = [("<think>\\boxed{no}</think>Let me see: \\boxed{go}.", "stop")] * 2
    ep, client, pool = _play(tokenizer_path, replies)
    assert pool.actions == ["\\boxed{go}", "\\boxed{go}"]
    assert (ep.status, ep.reward) == ("terminated", 1.0)
    sampling = client.requests[0][1]
    assert (sampling.top_p, sampling.top_k, sampling.max_new_tokens) == (0.95, 20, 8192)


def test_a_reply_cut_by_the_budget_ends_the_episode_truncated_with_reward_0(tokenizer_path):
    replies = [("\\boxed{go}", "stop"), ("\\boxed{go} and then I will", "length")]
    ep, _, pool = _play(tokenizer_path, replies)
    assert pool.actions == ["\\boxed{go}"]  # the cut reply never reached step()
    assert (ep.status, ep.reward, ep.turns) == ("reply_cut", 0.0, 2)
    assert sum(ep.loss_mask) == 6  # its tokens stay in the sample, as the reference's
    # the switch for settings whose action is a token or two: the cut reply is stepped
    ep, _, pool = _play(tokenizer_path, replies, cut_reply="step")
    assert (ep.status, ep.reward, len(pool.actions)) == ("terminated", 1.0, 2)


def test_turn_budget_is_the_context_left_less_64(tokenizer_path):
    replies = [("\\boxed{go}", "stop")] * 2
    _, client, _ = _play(tokenizer_path, replies, max_turn_tokens=8192, max_episode_tokens=200)
    prompt, sampling = client.requests[0]
    assert sampling.max_new_tokens == 200 - prompt - 64
    # context with 64 or fewer tokens left: the episode ends before generating
    ep, client, _ = _play(tokenizer_path, replies, max_episode_tokens=prompt + 64)
    assert (ep.status, ep.turns, client.requests) == ("token_limit", 0, [])


@pytest.mark.parametrize(
    "reply, malformed",
    [
        ('<tool_call>{"name": "find", "arguments": {"q": 1}}</tool_call>', False),
        ('<tool_call>{"name": "find"}</tool_call>', False),
        ("<tool_call>find(q=1)</tool_call>", True),
        ('<tool_call>{"arguments": {}}</tool_call>', True),
        ('<tool_call>{"name": "find", "arguments": "q"}</tool_call>', True),
        ("<tool_call>unclosed", True),
        ("<answer>42</answer>", False),  # no tool call at all: nothing to mask
    ],
)
def test_malformed_tool_call(reply, malformed):
    from spade_async.roles.agent import malformed_tool_call

    assert malformed_tool_call(reply) is malformed


def test_a_malformed_tool_call_turn_is_masked_and_an_all_masked_episode_trains_nothing():
    from spade_async.loop.batcher import agent_batch
    from spade_async.roles.agent import Episode

    def ep(mask, reward):
        return Episode(env_id="e", seed=0, hinted=False, token_ids=[1, 2, 3, 4, 5],
                       loss_mask=mask, logprobs=[0.0] * 5, turn_spans=[(1, 3), (4, 5)],
                       turn_versions=[0, 0], reward=reward, status="terminated", turns=2,
                       messages=[])  # fmt: skip

    # episode 1: its first turn was malformed (masked); episode 2: every turn masked
    eps = [ep([0, 0, 0, 0, 1], 1.0), ep([0, 0, 0, 0, 0], 0.0)]
    b = agent_batch(eps, AgentConfig())
    assert b.slots[0].loss_mask == [0, 0, 0, 0, 1] and b.slots[1] is None
    assert (b.episodes, b.filtered) == (2, 1)
    fan = agent_batch(eps, AgentConfig(thinking_fanout=True))  # per turn, masks respected
    # a masked turn adds nothing to its episode's one mean (slime's group_mask_sums); an
    # all-masked episode is one unit that trains nothing, however many turns it had
    assert [None if s is None else (s.loss_mask, s.loss_group) for s in fan.slots] == [
        ([0, 0, 0, 0, 1], 0),
        None,
    ]
