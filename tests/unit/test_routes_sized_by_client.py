"""Routes are sized against what the client sent (issue 45): the expected route rows are the
prompt tokens the client sent plus the tokens generated, never the prompt length the engine
reports; an engine that miscounts the prompt gets its routes refused, and the sample is
dropped and counted as a routes misfit."""

from __future__ import annotations

import anyio
import httpx
import msgspec
import numpy as np
import pytest

from spade_async.generation.client import GenerationClient
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.routed_experts import RouteShape, encode_sglang
from spade_async.loop.batcher import agent_batch, routes_misfit
from spade_async.roles.agent import AgentConfig, Episode

SHAPE = RouteShape(layers=2, topk=2, experts=8)
PROMPT = [1, 2, 3, 4, 5]
OUT = [6, 7]


def _serve(reported_prompt: int, route_rows: int, start: int = 0):
    routes = encode_sglang(np.ones((route_rows, 2, 2), dtype=np.int32))

    def handler(request):
        meta = {"id": "r", "prompt_tokens": reported_prompt, "completion_tokens": len(OUT),
                "weight_version": "0", "finish_reason": {"type": "length", "length": 2},
                "routed_experts": routes,
                "output_token_logprobs": [[-1.0, t, None] for t in OUT]}  # fmt: skip
        return httpx.Response(200, json={"text": "", "output_ids": OUT, "meta_info": meta})

    async def main():
        async with GenerationClient(["http://e1"]) as client:
            client._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
            client.enable_routes(SHAPE)
            return await client.generate(PROMPT, SamplingParams(), routes_from=start)

    return anyio.run(main)


def test_routes_that_fit_the_sent_prompt_are_kept():
    res = _serve(len(PROMPT), len(PROMPT) + len(OUT) - 1)
    assert res.routes_problem == "" and res.routed_experts is not None
    assert len(res.routed_experts) == (len(PROMPT) + len(OUT) - 1) * SHAPE.row_bytes
    later = _serve(len(PROMPT), len(PROMPT) + len(OUT) - 1 - 3, start=3)  # a later turn
    assert later.routes_problem == ""


@pytest.mark.parametrize("reported", [len(PROMPT) + 4, len(PROMPT) - 3, 0])
def test_an_engine_that_misreports_the_prompt_has_its_routes_refused(reported):
    """The engine's routes match its own (wrong) prompt count: before, the client believed
    it and kept routes that do not line up with the sample's tokens."""
    res = _serve(reported, max(0, reported + len(OUT) - 1))
    assert res.routed_experts is None
    assert "engine http://e1" in res.routes_problem
    assert f"reports {reported} prompt tokens; the client sent {len(PROMPT)}" in res.routes_problem
    assert routes_misfit(res.routes_problem)


def test_routes_sized_for_the_sent_prompt_but_a_wrong_report_are_refused_too():
    res = _serve(len(PROMPT) + 2, len(PROMPT) + len(OUT) - 1)
    assert res.routed_experts is None and routes_misfit(res.routes_problem)


def test_a_misreporting_engines_sample_is_dropped_and_counted():
    res = _serve(len(PROMPT) + 4, len(PROMPT) + 4 + len(OUT) - 1)
    ep = Episode(env_id="e", seed=0, hinted=False, token_ids=PROMPT + OUT,
                 loss_mask=[0] * len(PROMPT) + [1] * len(OUT), logprobs=[0.0] * 7,
                 turn_spans=[(5, 7)], turn_versions=[0], reward=1.0, status="terminated",
                 turns=1, messages=[])  # fmt: skip
    bad = msgspec.structs.replace(ep, routes_status=res.routes_problem)
    batch = agent_batch([ep, bad], AgentConfig())
    assert batch.routes_dropped == 1 and len(batch.samples) == 1
