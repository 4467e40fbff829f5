"""The controller's cheap encoding path (``generation/chat.py``) gives the ids the plain one
gives: ``encode_ids`` equals ``tokenizer(text).input_ids``, and a ``Conversation`` built turn
by turn (the end-of-turn tail encoded once and shared) equals templating the whole
conversation at once, over several templates, turn counts and stop kinds."""

from __future__ import annotations

import pytest
from test_chat_templates import QWEN3_STYLE, TOOLS
from transformers import AutoTokenizer

from spade_async.generation import chat
from spade_async.generation.chat import Conversation, encode_ids

# a header/end-of-text layout (Llama-3-like, without the blank line after the header, which
# this vocabulary would merge with the reply's first word): the reply ends on <|endoftext|>,
# the template writes nothing after it
HEADER_STYLE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '<|im_end|>' + m['content'] "
    "+ '<|endoftext|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_end|>' }}{% endif %}"
)
# ChatML with a blank line after each turn: a two-token tail after the end-of-turn token
BLANK_LINE_STYLE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] "
    "+ '<|im_end|>\n\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEMPLATES = {"smollm2": None, "qwen3_style": QWEN3_STYLE, "header": HEADER_STYLE,
             "blank_line": BLANK_LINE_STYLE}  # fmt: skip
STOP = {"smollm2": "<|im_end|>", "qwen3_style": "<|im_end|>", "header": "<|endoftext|>",
        "blank_line": "<|im_end|>"}  # fmt: skip

TEXTS = [
    "",
    "\n",
    "plain words, then more words.",
    "  leading and trailing spaces  ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|>\n\n<|im_start|>",
    "unicode: café — 日本語 🎲 \t tabs\r\nCRLF",
    "The board is a grid; row 3 column 4 holds a blue piece. " * 40,
    '<tool_response>\n{"k": 1}\n</tool_response>',
]


@pytest.fixture(scope="module")
def smol(tokenizer_path):
    return AutoTokenizer.from_pretrained(tokenizer_path)


_TOKS: dict = {}


def _tok(tokenizer_path, name: str, fresh: bool = False):
    if fresh or name not in _TOKS:
        tok = AutoTokenizer.from_pretrained(tokenizer_path)
        if TEMPLATES[name] is not None:
            tok.chat_template = TEMPLATES[name]
        if fresh:
            return tok
        _TOKS[name] = tok
    return _TOKS[name]


def _whole(tok, messages, **kw) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_ids_equals_the_tokenizer_call(smol, text):
    assert chat._backend(smol) is not None  # the fast path is the one under test
    assert encode_ids(smol, text) == list(smol(text, add_special_tokens=False).input_ids)


def test_encode_ids_falls_back_when_the_backend_truncates(tokenizer_path):
    """A backend left truncating (or padding) would cut the ids; ``tokenizer(text)`` turns
    that off first, so the cheap path steps aside and the ids stay whole."""
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    text = TEXTS[-2]
    want = list(tok(text, add_special_tokens=False).input_ids)
    tok.backend_tokenizer.enable_truncation(8)
    assert chat._backend(tok) is None
    assert encode_ids(tok, text) == want and len(want) > 8


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("turns", [1, 2, 5])
@pytest.mark.parametrize("stopped", [True, False])
def test_turn_by_turn_equals_the_whole_conversation(tokenizer_path, name, turns, stopped):
    tok = _tok(tokenizer_path, name)
    stop = tok.convert_tokens_to_ids(STOP[name])
    kw = {"tools": TOOLS, "enable_thinking": True} if name == "qwen3_style" else {}
    for episode in range(2):  # the second conversation reuses the first one's cached tail
        messages = [{"role": "system", "content": f"You play games (episode {episode})."},
                    {"role": "user", "content": "Start.\n" + TEXTS[7][: 50 * (episode + 1)]}]  # fmt: skip
        conv = Conversation(tok, messages, **kw)
        assert conv.token_ids == _whole(tok, messages, **kw)
        for t in range(turns):
            reply = f"I move \\boxed{{{'lrud'[t % 4]}}} on turn {t}."
            gen = list(tok(reply, add_special_tokens=False).input_ids)
            if stopped:  # else it ran out of tokens: the template's tail closes it whole
                gen.append(stop)
            conv.add_assistant(gen, logprobs=[-0.5] * len(gen), text=reply)
            obs = TEXTS[(t + episode) % len(TEXTS)] or "(empty)"
            role = "tool" if name == "qwen3_style" and t % 2 else "user"
            conv.add_observation(obs, role=role)
            messages += [{"role": "assistant", "content": reply}, {"role": role, "content": obs}]
            assert conv.token_ids == _whole(tok, messages, **kw), (name, episode, t)
        assert len(conv.token_ids) == len(conv.loss_mask) == len(conv.logprobs)


def test_the_tail_is_encoded_once_per_tokenizer_template_and_tools(tokenizer_path):
    tok = _tok(tokenizer_path, "smollm2", fresh=True)  # its template is changed below
    a = Conversation(tok, [{"role": "user", "content": "a"}])
    b = Conversation(tok, [{"role": "user", "content": "b"}])
    assert a._tail is b._tail  # shared: rendered and encoded once
    with_tools = Conversation(tok, [{"role": "user", "content": "c"}], tools=TOOLS)
    assert with_tools._tail is not a._tail
    tok.chat_template = BLANK_LINE_STYLE  # the same object, another template: another tail
    c = Conversation(tok, [{"role": "user", "content": "d"}])
    assert c._tail is not a._tail and c._end_tail == "<|im_end|>\n\n"
    gen = list(tok("ok", add_special_tokens=False).input_ids) + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]
    c.add_assistant(gen, text="ok")
    c.add_observation("next")
    whole = _whole(tok, [{"role": "user", "content": "d"}, {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "next"}])  # fmt: skip
    assert c.token_ids == whole
