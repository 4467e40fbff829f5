"""The hint writer: the same policy reads an environment's code and writes a privileged hint.

Never trained, and rendered with thinking off (Qwen3 ``enable_thinking=False``; a
``<think>`` block that still appears is stripped). The prompt forbids leaking the answer, and ``leaks_solution`` checks each hint
against the environment's reference solution (replayed from a fresh instance): a leaking hint
is regenerated up to ``retries`` times, then dropped. Leaks are counted for the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from spade_async.config import Doc
from spade_async.envs.pool import EnvError
from spade_async.envs.validate import solution_actions
from spade_async.generation.chat import render_prompt, strip_think
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.seeds import request_seed
from spade_async.roles.agent import EnvRef
from spade_async.roles.prompts import hint_prompt, hint_system, leaks_solution
from spade_async.roles.services import Services


class HintConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: Doc(
        bool, "generate hints (without them regret is 0 and only the plateau term counts)"
    ) = True
    temperature: Doc(float, "hint sampling temperature") = 0.3
    max_new_tokens: Doc(
        int, "hint length limit in tokens (the reference recipes' --spare-hint-max-tokens)"
    ) = 4096
    retries: Doc(int, "regenerations after a leaking hint before it is dropped") = 2
    max_code_chars: Doc(int, "environment source shown to the hint writer, in characters") = 12_000


@dataclass
class HintResult:
    hint: str | None  # None: disabled, dropped after leaks, or the engine gave nothing
    leaks: int
    tokens: int


async def write_hint(
    services: Services,
    *,
    env: EnvRef,
    seed: int,
    cfg: HintConfig,
    request_key: int | None = None,
) -> HintResult:
    """``seed``: the reset seed of the instance ``solution()`` runs on (leak check);
    ``request_key``: the hint's request seed (``generation/seeds.py``), each attempt's
    ``sampling_seed`` derived from it (None: unseeded)."""
    if not cfg.enabled:
        return HintResult(None, 0, 0)
    client, pool, tokenizer = services.client, services.pool, services.tokenizer
    actions: list[str] = []
    try:
        inst = await pool.open(env.source, env_id=env.env_id)
        try:
            await pool.reset(inst, seed)
            actions = solution_actions(await pool.solution(inst)) or []
        finally:
            await pool.close(inst)
    except EnvError:
        actions = []
    prompt = render_prompt(
        tokenizer,
        [
            {"role": "system", "content": hint_system(env.setting)},
            {"role": "user", "content": hint_prompt(env.source[: cfg.max_code_chars])},
        ],
        enable_thinking=False,  # a hint is an answer, not a chain of thought (Qwen3)
    )
    leaks = tokens = 0
    for attempt in range(cfg.retries + 1):
        sampling_seed = None if request_key is None else request_seed(request_key, attempt)
        res = await client.generate(
            prompt,
            SamplingParams(
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                sampling_seed=sampling_seed,
            ),
            return_logprob=False,
        )
        tokens += len(res.output_ids)
        text = strip_think(res.text)  # a template without a thinking switch may still think
        if not text:
            continue
        if actions and leaks_solution(text, actions):
            leaks += 1
            continue
        return HintResult(text, leaks, tokens)
    return HintResult(None, leaks, tokens)
