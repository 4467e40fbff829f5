"""Chat templating for both roles, and append-only multi-turn token lists.

``render_prompt`` turns system/user messages (plus OpenAI function schemas for tool-use
environments, and ``enable_thinking`` where the template knows it) into prompt token ids.

``Conversation`` keeps one episode's running token list. The model's generated ids are
appended verbatim (never re-tokenized: re-tokenizing a trajectory breaks PPO), then each
observation appends only the tokens the chat template puts after that assistant turn:
the template's end-of-turn tail (e.g. ``"\\n"`` after ``<|im_end|>``, or ``<|im_end|>\\n``
when generation stopped on length), the observation turn(s) and the next generation
prompt. Those deltas are computed once per observation by rendering a fixed two-message
base conversation with and without the new turns and taking the suffix, so the token list
is identical to templating the whole conversation at once whenever the template is
append-only for that history (ChatML/SmolLM2 always; Qwen3-style templates with thinking
for tool turns). Qwen3-style templates drop earlier turns' ``<think>`` blocks once a new
*user* query arrives, so there the whole-conversation rendering differs from what the
model saw; the ``Conversation`` keeps what the model saw, which is what training needs.

``loss_mask`` is 1 on generated tokens and 0 on prompt/template/observation tokens;
``logprobs`` holds the engine's log-prob per generated token (0.0 elsewhere).

CPU (the controller encodes every observation; ``docs/throughput.md`` section 4): texts are
encoded on a fast tokenizer's Rust backend directly (``encode_ids``: the same pipeline and
ids as ``tokenizer(text)``, without its Python layers and the character offsets it
computes and drops: ~25% less CPU a 500-character observation), and what a template writes after an
assistant turn (its end-of-turn tail, and the tail's ids after each stop token) is
rendered and encoded once per tokenizer, template, tools and thinking flag, not per turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from spade_async.errors import ConfigError

__all__ = ["render_prompt", "render_text", "Conversation", "strip_think", "encode_ids"]

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)

_SENTINEL = "@@spade-sentinel@@"


def render_text(
    tokenizer: Any,
    messages: Sequence[dict],
    *,
    tools: Sequence[dict] | None = None,
    enable_thinking: bool | None = None,
    add_generation_prompt: bool = True,
) -> str:
    kwargs: dict[str, Any] = {}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"tokenizer '{tokenizer.name_or_path}' has no chat template; use an instruct model"
        )
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks (an unclosed one runs to the end;
    a stray ``</think>`` drops what precedes it, as Qwen3 prompts open the block themselves).
    What reaches a hint, an environment or a score never carries the reasoning."""
    if "</think>" in text:
        tail = text.rsplit("</think>", 1)
        text = tail[1] if "<think>" not in tail[0] else _THINK.sub("", tail[0]) + tail[1]
    return _THINK.sub("", text).strip()


def _backend(tokenizer: Any):
    """The ``tokenizers.Tokenizer`` under a Hugging Face fast tokenizer when encoding on it
    directly gives ``tokenizer(text, add_special_tokens=False)``'s ids: no truncation or
    padding set on it (``__call__`` would switch them off first) and special tokens split
    as the wrapper says; else None (a slow or simulated tokenizer: its own ``__call__``)."""
    bt = getattr(tokenizer, "backend_tokenizer", None)
    if bt is None or type(bt).__module__.split(".")[0] != "tokenizers":
        return None
    if bt.truncation is not None or bt.padding is not None:
        return None
    if bt.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return bt


def encode_ids(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text, add_special_tokens=False).input_ids`` (see the module docstring)."""
    bt = _backend(tokenizer)
    if bt is None:
        return list(tokenizer(text, add_special_tokens=False).input_ids)
    fast = getattr(bt, "encode_batch_fast", None)  # tokenizers >= 0.20: no character offsets
    if fast is not None:
        return fast([text], add_special_tokens=False)[0].ids
    return bt.encode(text, add_special_tokens=False).ids


_encode = encode_ids


def render_prompt(
    tokenizer: Any,
    messages: Sequence[dict],
    *,
    tools: Sequence[dict] | None = None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """Prompt token ids ending with the assistant generation prompt."""
    return _encode(
        tokenizer, render_text(tokenizer, messages, tools=tools, enable_thinking=enable_thinking)
    )


class Conversation:
    """One multi-turn episode's running token list (see module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        messages: Sequence[dict],
        *,
        tools: Sequence[dict] | None = None,
        enable_thinking: bool | None = None,
    ) -> None:
        self.tokenizer, self.tools, self.enable_thinking = tokenizer, tools, enable_thinking
        self.messages: list[dict] = [dict(m) for m in messages]
        self.token_ids: list[int] = render_prompt(
            tokenizer, self.messages, tools=tools, enable_thinking=enable_thinking
        )
        self.prompt_len = len(self.token_ids)
        self.loss_mask: list[int] = [0] * self.prompt_len
        self.logprobs: list[float] = [0.0] * self.prompt_len
        self.turns = 0
        self._last_id: int | None = None  # the last generated id (None: no output yet)
        self._tail = _tail(self)
        self._end_tail = self._tail.text

    def add_assistant(
        self,
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        text: str | None = None,
    ) -> None:
        """Append the generated ids verbatim (loss mask 1) and record the message."""
        if logprobs is not None and len(logprobs) != len(output_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(output_ids)} output ids")
        self.token_ids.extend(output_ids)
        self.loss_mask.extend([1] * len(output_ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(output_ids))
        if text is None:
            text = self.tokenizer.decode(list(output_ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        self._last_id = int(output_ids[-1]) if len(output_ids) else None
        self.turns += 1

    def add_observation(self, content: str, role: str = "user") -> list[int]:
        """Append one observation turn (``user`` for games, ``tool`` for tool results)."""
        return self.add_observations([{"role": role, "content": content}])

    def add_observations(self, turns: Sequence[dict]) -> list[int]:
        """Append consecutive non-assistant turns and the next generation prompt; returns the
        appended ids. Several tool results go in one call (templates merge them)."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("add_observations() must follow add_assistant()")
        delta = self._end_of_turn_ids() + _encode(self.tokenizer, self._turns_text(turns))
        self.token_ids.extend(delta)
        self.loss_mask.extend([0] * len(delta))
        self.logprobs.extend([0.0] * len(delta))
        self.messages.extend(dict(t) for t in turns)
        return delta

    # ---- template probing ------------------------------------------------------------------
    def _base(self) -> list[dict]:
        return [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]

    def _render(self, messages: list[dict], gen: bool) -> str:
        return render_text(
            self.tokenizer,
            messages,
            tools=self.tools,
            enable_thinking=self.enable_thinking,
            add_generation_prompt=gen,
        )

    def _turn_end_tail(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        text = self._render(self._base(), gen=False)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ConfigError(
                "chat template drops assistant content; cannot build multi-turn prompts"
            )
        return text[at + len(_SENTINEL) :]

    def _end_of_turn_ids(self) -> list[int]:
        """Template tokens that close the last assistant turn after its generated ids (a
        list shared through the cache: callers copy, never extend it)."""
        return self._tail.ids_after(self._last_id)

    def _turns_text(self, turns: Sequence[dict]) -> str:
        """Text the template writes for ``turns`` + generation prompt after an assistant turn:
        the suffix after the base assistant's content and end-of-turn tail."""
        after = self._render(self._base() + [dict(t) for t in turns], gen=True)
        at = after.rfind(_SENTINEL)
        suffix = after[at + len(_SENTINEL) :] if at >= 0 else ""
        if at < 0 or not suffix.startswith(self._end_tail):
            roles = ", ".join(t["role"] for t in turns)
            raise ConfigError(
                f"chat template renders an assistant turn differently once ({roles}) turns follow; "
                "this template cannot be used for multi-turn episodes"
            )
        return suffix[len(self._end_tail) :]


class _Tail:
    """What a template writes after an assistant message's content (``text``), for one
    tokenizer, template, tools and thinking flag: its ids, and per special stop token the ids
    of the rest of it (a reply that stopped on the end-of-turn token already holds it)."""

    __slots__ = ("tokenizer", "text", "ids", "special", "after")

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.tokenizer, self.text = tokenizer, text
        self.ids = _encode(tokenizer, text)
        self.special = frozenset(tokenizer.all_special_ids)
        self.after: dict[int, list[int]] = {}

    def ids_after(self, last: int | None) -> list[int]:
        if last is None or last not in self.special:
            return self.ids  # stopped on length or a stop string
        hit = self.after.get(last)
        if hit is None:
            stop_text = self.tokenizer.decode([last], skip_special_tokens=False)
            if stop_text and self.text.startswith(stop_text):  # stopped on the end-of-turn token
                hit = _encode(self.tokenizer, self.text[len(stop_text) :])
            else:
                hit = self.ids
            self.after[last] = hit
        return hit


_TAILS: dict[tuple, _Tail] = {}
_TAILS_MAX = 256


def _tail(conv: Conversation) -> _Tail:
    """``conv``'s template tail, rendered and encoded once per key (see ``_Tail``)."""
    tok = conv.tokenizer
    tpl = tok.chat_template
    tools = json.dumps(conv.tools, sort_keys=True, default=repr) if conv.tools else None
    key = (id(tok), tpl if isinstance(tpl, str) else repr(tpl), tools, conv.enable_thinking)
    hit = _TAILS.get(key)
    if hit is not None and hit.tokenizer is tok:
        return hit
    hit = _Tail(tok, conv._turn_end_tail())
    if len(_TAILS) >= _TAILS_MAX:
        _TAILS.clear()
    _TAILS[key] = hit
    return hit
