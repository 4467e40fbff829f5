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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from spade_async.errors import ConfigError

__all__ = ["render_prompt", "render_text", "Conversation", "strip_think"]

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


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


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
        self._end_tail = self._turn_end_tail()

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
        self._last_output = list(output_ids)
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
        """Template tokens that close the last assistant turn after its generated ids."""
        tail = self._end_tail
        if self._last_output and self._last_output[-1] in set(self.tokenizer.all_special_ids):
            stop_text = self.tokenizer.decode(self._last_output[-1:], skip_special_tokens=False)
            if stop_text and tail.startswith(stop_text):  # stopped on the end-of-turn token
                return _encode(self.tokenizer, tail[len(stop_text) :])
        return _encode(self.tokenizer, tail)  # stopped on length or a stop string

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
