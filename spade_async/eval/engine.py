"""Generation for evaluation: an engine client + tokenizer as a ``Generator``; model lookup.

A model is an embedded name or a Hugging Face directory; a run directory evaluates its
latest export (``hf/``) at the policy version of its latest checkpoint.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

from spade_async.eval.types import Item, Sampling
from spade_async.generation.chat import render_prompt
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.seeds import request_seed

__all__ = ["ClientGenerator", "resolve_target"]


class ClientGenerator:
    """Chat messages -> one completion through the project's ``GenerationClient``.

    Every request carries a ``sampling_seed`` (``generation/seeds.py``) from ``seed``, the
    item's id, the prompt's tokens and how many times this generator was asked that same
    prompt of that item before (the ``n`` samples of a problem: the k-th ask draws with the
    k-th seed, whatever order they arrive in). A new generator per evaluation starts the
    count afresh, so every evaluation of a run draws the same seeds (comparable versions)."""

    def __init__(self, client: Any, tokenizer: Any, *, max_context: int = 0, seed: int = 0) -> None:
        self.client, self.tokenizer, self.max_context = client, tokenizer, max_context
        self.seed = seed
        self.requests = 0
        self._asked: Counter[tuple[str, bytes]] = Counter()

    def request_seed(self, item: Item | None, ids: list[int]) -> int:
        """The seed of the next ask of prompt ``ids`` for ``item``."""
        digest = hashlib.blake2b(repr(list(ids)).encode(), digest_size=16).digest()
        key = (item.id if item is not None else "", digest)
        k = self._asked[key]
        self._asked[key] += 1
        return request_seed(self.seed, "eval", key[0], digest.hex(), k)

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
            sampling_seed=self.request_seed(item, list(ids)),
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
