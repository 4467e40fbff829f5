"""Chat templating: multi-turn token lists equal templating the whole conversation at once."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from spade_async.generation.chat import Conversation, render_prompt

# Qwen3-style: tools in the system block, <tool_call>/<tool_response>, consecutive tool
# results merged into one user turn, <think> kept after the last user query, and an empty
# think block in the generation prompt when enable_thinking is false.
QWEN3_STYLE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a key",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def smol(tokenizer_path):
    return AutoTokenizer.from_pretrained(tokenizer_path)


@pytest.fixture(scope="module")
def qwen_style(tokenizer_path, tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    tok.chat_template = QWEN3_STYLE
    folder = tmp_path_factory.mktemp("qwen_style_tok")
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _whole(tok, messages, **kw) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _generated(tok, content: str) -> list[int]:
    """What a model emits for ``content``: its tokens, then the end-of-turn token."""
    return tok(content, add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids("<|im_end|>")]


def test_smollm2_multi_turn_is_token_identical(smol):
    messages = [{"role": "system", "content": "You play games."}, {"role": "user", "content": "Start."}]
    conv = Conversation(smol, messages)
    assert conv.token_ids == _whole(smol, messages)
    replies = ["I move \\boxed{left}.", "Now \\boxed{up}!"]
    observations = ["You see a wall.\nScore: 0", "You win. Score 1"]
    for reply, obs in zip(replies, observations, strict=True):
        gen = _generated(smol, reply)
        conv.add_assistant(gen, logprobs=[-0.5] * len(gen), text=reply)
        conv.add_observation(obs)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
        assert conv.token_ids == _whole(smol, messages)
    # loss mask covers exactly the generated tokens
    assert sum(conv.loss_mask) == sum(len(_generated(smol, r)) for r in replies)
    assert len(conv.loss_mask) == len(conv.token_ids) == len(conv.logprobs)


def test_length_stopped_turn_gets_closed_by_template(smol):
    conv = Conversation(smol, [{"role": "user", "content": "Go."}])
    cut = smol("I will move", add_special_tokens=False).input_ids  # no <|im_end|>: hit max tokens
    conv.add_assistant(cut, text="I will move")
    conv.add_observation("Too long.")
    whole = _whole(
        smol,
        [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": "I will move"},
            {"role": "user", "content": "Too long."},
        ],
    )
    assert conv.token_ids == whole


def test_qwen3_style_tools_and_thinking_is_token_identical(qwen_style):
    tok = qwen_style
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Find k."}]
    conv = Conversation(tok, messages, tools=TOOLS, enable_thinking=True)
    assert conv.token_ids == _whole(tok, messages, tools=TOOLS, enable_thinking=True)
    assert b"lookup" in json.dumps(TOOLS).encode() and "lookup" in tok.decode(conv.token_ids)
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>'
    turns = [
        (f"<think>\nI should look it up.\n</think>\n\n{call}", ["v1", "v2"]),
        ("<think>\nTwo values.\n</think>\n\n<answer>v1</answer>", ["checked"]),
    ]
    for reply, results in turns:
        conv.add_assistant(_generated(tok, reply), text=reply)
        conv.add_observations([{"role": "tool", "content": r} for r in results])
        messages.append({"role": "assistant", "content": reply})
        messages += [{"role": "tool", "content": r} for r in results]
        assert conv.token_ids == _whole(tok, messages, tools=TOOLS, enable_thinking=True)
    assert "<think>\nI should look it up." in tok.decode(conv.token_ids)


def test_qwen3_style_thinking_off_prompt(qwen_style):
    messages = [{"role": "user", "content": "Hi"}]
    ids = render_prompt(qwen_style, messages, enable_thinking=False)
    assert qwen_style.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ids == _whole(qwen_style, messages, enable_thinking=False)
    on = render_prompt(qwen_style, messages, enable_thinking=True)
    assert qwen_style.decode(on).endswith("<|im_start|>assistant\n")


def test_observation_before_assistant_is_an_error(smol):
    conv = Conversation(smol, [{"role": "user", "content": "Go."}])
    with pytest.raises(ValueError, match="must follow add_assistant"):
        conv.add_observation("nope")


def test_qwen3_style_user_turn_keeps_what_the_model_saw(qwen_style):
    """A new user query makes Qwen3 templates drop earlier <think> blocks; the running list
    keeps the generated tokens verbatim instead (what the policy actually conditioned on)."""
    tok = qwen_style
    messages = [{"role": "user", "content": "Play."}]
    conv = Conversation(tok, messages, enable_thinking=True)
    reply = "<think>\nplan\n</think>\n\n\\boxed{a}"
    gen = _generated(tok, reply)
    conv.add_assistant(gen, text=reply)
    delta = conv.add_observation("Next.")
    assert conv.token_ids[conv.prompt_len : conv.prompt_len + len(gen)] == gen
    assert tok.decode(delta) == "\n<|im_start|>user\nNext.<|im_end|>\n<|im_start|>assistant\n"
    whole = _whole(tok, messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Next."}])
    assert "plan" not in tok.decode(whole) and "plan" in tok.decode(conv.token_ids)
