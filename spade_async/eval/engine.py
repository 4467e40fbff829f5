"""Generation for evaluation: an engine client + tokenizer as a ``Generator``; model lookup.

A model is an embedded name or a Hugging Face directory; a run directory evaluates its
latest export (``hf/``) at the policy version of its latest checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spade_async.eval.types import Item, Sampling
from spade_async.generation.chat import render_prompt
from spade_async.generation.protocol import SamplingParams

__all__ = ["ClientGenerator", "resolve_target"]


class ClientGenerator:
    """Chat messages -> one completion through the project's ``GenerationClient``."""

    def __init__(self, client: Any, tokenizer: Any, *, max_context: int = 0) -> None:
        self.client, self.tokenizer, self.max_context = client, tokenizer, max_context
        self.requests = 0

    async def __call__(
        self, messages: list[dict], sampling: Sampling, *, item: Item | None = None,
        tools: list[dict] | None = None,
    ) -> str:  # fmt: skip
        ids = (
            render_prompt(self.tokenizer, messages)
            if tools is None
            else self._with_tools(messages, tools)
        )
        params = SamplingParams(
            max_new_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p,
        )  # fmt: skip
        self.requests += 1
        out = await self.client.generate(ids, params, return_logprob=False)
        return out.text

    def _with_tools(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """Tools through the model's own chat template; a template without tool support gets
        BFCL's QwenFCHandler formatting (ChatML with a ``<tools>`` system block) instead, so
        the model sees the functions either way."""
        template = self.tokenizer.chat_template or ""
        if "tools" in template:
            return render_prompt(self.tokenizer, messages, tools=tools)
        from spade_async.eval.suites.bfcl_lib import qwen_fc_format

        text = qwen_fc_format(messages, tools)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def resolve_target(target: str) -> tuple[Path, str, int | None]:
    """``(model_dir, label, policy_version)`` for a model name, HF directory or run directory."""
    from spade_async.errors import SpadeError
    from spade_async.models import resolve_model
    from spade_async.rundir import RunDir

    path = Path(target).expanduser()
    if path.is_dir() and (path / "config.toml").is_file() and not (path / "config.json").is_file():
        run = RunDir(path)
        latest = run.latest_checkpoint()
        if not run.hf.is_dir() or latest is None:
            raise SpadeError(
                f"run directory {path} has no checkpoint with an hf/ export yet; train first"
            )
        return run.hf, f"{path.name}@step-{latest[0]}", latest[0]
    return resolve_model(target), target, None
