"""Routing replay's capture side: the CPU engine serves SGLang's routed experts (same fields,
same wire form, same refusals), the client asks for them turn by turn and checks them, and
a misfit drops the sample with one warning naming the engine."""

from __future__ import annotations

import base64
import logging

import anyio
import numpy as np
import pytest

from spade_async.generation.routed_experts import (
    RouteError,
    RouteShape,
    check_sample,
    decode_sglang,
    encode_sglang,
    route_shape,
)

SHAPE = RouteShape(layers=2, topk=2, experts=8)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from spade_async.models import tiny_moe_dir

    return tiny_moe_dir(tmp_path_factory.mktemp("moe") / "model")


@pytest.fixture(scope="module")
def moe_server(moe_dir):
    from spade_async.generation.server import make_engine_app, serve_in_thread

    app = make_engine_app(str(moe_dir), routed_experts=True)
    with serve_in_thread(app) as url:
        yield url


def _post(url, body):
    import httpx

    return httpx.post(url + "/generate", json=body, timeout=60)


def _ids(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i4").reshape(-1, 2, 2)


def test_wire_form_round_trips_and_misfits_are_one_line():
    ids = np.arange(12, dtype=np.int32).reshape(3, 2, 2) % 8
    data = decode_sglang(encode_sglang(ids), SHAPE, 3)
    assert np.frombuffer(data, dtype=np.uint8).reshape(3, 2, 2).tolist() == ids.tolist()
    with pytest.raises(RouteError, match="has 3 token rows, expected 4"):
        decode_sglang(encode_sglang(ids), SHAPE, 4)
    with pytest.raises(RouteError, match="not a whole number of rows"):
        decode_sglang(encode_sglang(ids[:, :1]), SHAPE, 3)  # one layer short
    with pytest.raises(RouteError, match="expert id 9, outside"):
        decode_sglang(encode_sglang(ids + 2), SHAPE, 3)
    with pytest.raises(RouteError, match="not base64"):
        decode_sglang("%%%", SHAPE, 3)
    with pytest.raises(RouteError, match="cover 3 tokens"):
        check_sample(data, SHAPE, 6, [0, 0, 0, 0, 0, 1])
    check_sample(data, SHAPE, 6, [0, 0, 1, 1, 0, 0])  # trailing untrained tokens route freely
    assert route_shape({"num_hidden_layers": 2}) is None


def test_engine_returns_rows_start_to_seqlen_minus_one(moe_server):
    body = {"input_ids": [5, 6, 7, 8, 9], "return_routed_experts": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}  # fmt: skip
    out = _post(moe_server, body).json()
    full = _ids(out["meta_info"]["routed_experts"])
    assert full.shape == (5 + 4 - 1, 2, 2) and full.min() >= 0 and full.max() < 8
    later = _post(moe_server, {**body, "routed_experts_start_len": 5}).json()
    assert _ids(later["meta_info"]["routed_experts"]).shape == (4 - 1 + 5 - 5, 2, 2)
    plain = _post(moe_server, {k: v for k, v in body.items() if k != "return_routed_experts"})
    assert "routed_experts" not in plain.json()["meta_info"]


@pytest.mark.parametrize(("start", "why"), [(-1, "lower than 0"), (6, "higher than the number")])
def test_engine_refuses_what_sglang_refuses(moe_server, start, why):
    body = {"input_ids": [5, 6, 7, 8, 9], "return_routed_experts": True,
            "routed_experts_start_len": start}  # fmt: skip
    resp = _post(moe_server, body)
    assert resp.status_code == 400 and why in resp.json()["error"]["message"]


def test_dense_model_refuses_the_flag(tiny_model):
    from spade_async.errors import ConfigError
    from spade_async.generation.server import make_engine_app

    with pytest.raises(ConfigError, match="dense model"):
        make_engine_app(str(tiny_model), routed_experts=True)


def test_turn_by_turn_routes_equal_one_full_request(moe_server):
    """Each turn asks from the rows it lacks; the concatenation is what one request over the
    whole context returns (fp32 engine, one request at a time: the same arithmetic)."""
    from spade_async.generation.client import GenerationClient
    from spade_async.generation.protocol import SamplingParams
    from spade_async.roles.episode_routes import EpisodeRoutes

    async def main():
        async with GenerationClient([moe_server]) as client:
            client.enable_routes(SHAPE)
            routes, ids = EpisodeRoutes(client), [11, 12, 13, 14]
            for turn in range(3):
                sp = SamplingParams(max_new_tokens=3, ignore_eos=True, sampling_seed=turn)
                res = await client.generate(ids, sp, routes_from=routes.start())
                routes.add(res, len(ids))
                ids = ids + res.output_ids + [20 + turn, 21]  # an observation
            ids = ids[:-2]
            sp = SamplingParams(max_new_tokens=1, ignore_eos=True)
            whole = await client.generate(ids[:-1], sp)
            return routes, ids, whole

    routes, ids, whole = anyio.run(main)
    assert routes.status == "" and routes.rows == len(ids) - 1
    got = np.frombuffer(bytes(routes.data), dtype=np.uint8).reshape(-1, 2, 2)
    ref = np.frombuffer(whole.routed_experts, dtype=np.uint8).reshape(-1, 2, 2)
    assert got.shape == (len(ids) - 1, 2, 2)
    assert (np.sort(got, -1) == np.sort(ref[: len(got)], -1)).all()


def test_misfit_routes_drop_the_sample_with_one_warning(caplog):
    """An engine whose routes have the wrong layer count: routes_problem names it, the
    client warns once for that engine, the batcher drops the episode and counts it."""
    import httpx
    import msgspec

    from spade_async.generation.client import GenerationClient
    from spade_async.generation.protocol import SamplingParams
    from spade_async.loop.batcher import agent_batch
    from spade_async.roles.agent import AgentConfig, Episode

    bad = encode_sglang(np.zeros((4, 3, 2), dtype=np.int32))  # 3 layers, not 2

    def handler(request):
        meta = {"id": "r", "prompt_tokens": 3, "completion_tokens": 2, "weight_version": "0",
                "finish_reason": {"type": "length", "length": 2}, "routed_experts": bad,
                "output_token_logprobs": [[-1.0, 4, None], [-1.0, 5, None]]}  # fmt: skip
        return httpx.Response(200, json={"text": "", "output_ids": [4, 5], "meta_info": meta})

    async def main():
        async with GenerationClient(["http://e1"]) as client:
            client._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
            client.enable_routes(SHAPE)
            return [await client.generate([1, 2, 3], SamplingParams()) for _ in range(2)]

    with caplog.at_level(logging.WARNING, logger="spade_async.generation.client"):
        results = anyio.run(main)
    assert all("engine http://e1" in r.routes_problem for r in results)
    assert len([r for r in caplog.records if "http://e1" in r.getMessage()]) == 1
    ep = Episode(env_id="e", seed=0, hinted=False, token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1],
                 logprobs=[0.0] * 4, turn_spans=[(2, 4)], turn_versions=[0], reward=1.0,
                 status="terminated", turns=1, messages=[])  # fmt: skip
    bad_ep = msgspec.structs.replace(ep, routes_status=results[0].routes_problem)
    missing = msgspec.structs.replace(ep, routes_status="missing", reward=0.0)
    batch = agent_batch([ep, bad_ep, missing], AgentConfig())
    assert batch.routes_dropped == 1 and len(batch.samples) == 2
