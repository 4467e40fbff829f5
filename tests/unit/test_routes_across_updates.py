"""Routing replay across weight updates (issue 42), on the CPU engine imitating SGLang's
retract: a pause in ``retract`` mode frees the running rows' KV and re-prefills them on
continue, so their routes are the re-prefill's; an update between two turns of every
episode closes the episode's route epoch and the next turn asks from position 0; each
trainer sample then replays, on every trained token, the routes the engine used when it
sampled that token (fp32 engine: an offline fp32 forward of the weights that sampled a
turn routes its context as the engine did)."""

from __future__ import annotations

import time

import anyio
import httpx
import numpy as np
import pytest
import torch

from spade_async.generation.routed_experts import RouteShape

SHAPE = RouteShape(layers=2, topk=2, experts=8)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from spade_async.models import tiny_moe_dir

    root = tmp_path_factory.mktemp("moe")
    # the recipes' setting; B: other weights, the same shapes (the update)
    return (tiny_moe_dir(root / "a", norm_topk_prob=True, seed=0),
            tiny_moe_dir(root / "b", norm_topk_prob=True, seed=1))  # fmt: skip


@pytest.fixture(scope="module")
def models(dirs):
    from transformers import AutoModelForCausalLM

    from spade_async.generation.route_capture import of

    out = {}
    for version, d in zip(("0", "1"), dirs, strict=True):
        lm = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        out[version] = (lm, of(lm))
    return out


def _truth(models, version: str, ids: list[int]) -> np.ndarray:
    """Rows [0, len(ids)) of the weights ``version`` over ``ids`` (sorted top-k)."""
    lm, cap = models[version]
    with torch.no_grad():
        lm(torch.tensor([ids]))
    return np.sort(cap.take().numpy(), -1)


@pytest.fixture
def server(dirs):
    from spade_async.generation.server import make_engine_app, serve_in_thread

    app = make_engine_app(str(dirs[0]), routed_experts=True)
    with serve_in_thread(app) as url:
        yield url, app


async def _update(client, path: str, version: str) -> None:
    """What a weight push does with pause_mode = "retract" (trainer/ipc.py)."""
    await client.pause("retract")
    await client.update_weights_from_disk(path, weight_version=version)
    await client.resume()
    await client.weight_versions()


def test_retract_reprefills_and_its_rows_come_from_the_reprefill(server, dirs, models):
    """A request retracted mid-generation: its weight_versions spans show the update, and the
    rows of every position before the retract point are the new weights' (SGLang's: the
    re-prefill's), not the rows its old-weight tokens were sampled with."""
    url, app = server
    prompt = list(range(30, 50))
    body = {"input_ids": prompt, "return_logprob": True, "return_routed_experts": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 1.0,
                                "sampling_seed": 3}}  # fmt: skip
    box = {}

    async def main():
        from spade_async.generation.client import GenerationClient

        async with GenerationClient([url]) as client:
            async with anyio.create_task_group() as tg:

                async def gen():
                    async with httpx.AsyncClient(timeout=120) as h:
                        box["r"] = (await h.post(url + "/generate", json=body)).json()

                tg.start_soon(gen)
                t0 = time.monotonic()
                while app.engine.stats["tokens"] < 8 and time.monotonic() - t0 < 60:
                    await anyio.sleep(0.001)
                await _update(client, str(dirs[1]), "1")

    anyio.run(main)
    assert app.engine.stats.get("retractions", 0) == 1
    meta = box["r"]["meta_info"]
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "1"] and 0 < spans[0]["end"] < 400
    k = spans[0]["end"]  # output tokens sampled under the old weights
    out = box["r"]["output_ids"]
    from spade_async.generation.routed_experts import decode_sglang

    rows = np.frombuffer(decode_sglang(meta["routed_experts"], SHAPE, len(prompt) + 399), np.uint8)
    rows = np.sort(rows.reshape(-1, 2, 2), -1)
    ids = prompt + out
    recomputed = len(prompt) + k  # the re-prefill's positions
    new = _truth(models, "1", ids[:recomputed])
    old = _truth(models, "0", ids[:recomputed])
    assert (rows[:recomputed] == new).all()
    assert (rows[:recomputed] != old).any()  # the update changed routes: the check has teeth


def _episode(turns, ids, epochs_and_rows):
    from spade_async.roles.agent import Episode

    routed, epochs = epochs_and_rows
    spans = [(a, b) for a, b, _ in turns]
    mask = [0] * len(ids)
    for a, b in spans:
        mask[a:b] = [1] * (b - a)
    return Episode(env_id="e", seed=0, hinted=False, token_ids=ids, loss_mask=mask,
                   logprobs=[0.0] * len(ids), turn_spans=spans,
                   turn_versions=[int(v) for _, _, v in turns], reward=1.0,
                   status="terminated", turns=len(spans), messages=[],
                   routed_experts=routed, route_epochs=epochs)  # fmt: skip


def test_an_update_between_turns_replays_the_sampling_routes_on_every_trained_token(
    server, dirs, models
):
    """Every episode: turn 1 on weights 0, a retract-mode update, turn 2 on weights 1. The
    batcher's samples replay, for every trained token, the rows of the weights that sampled
    it over its whole context (asked again from 0 after the update); the rows the old rule
    kept (turn 1's for the shared prefix) would not."""
    from spade_async.generation.client import GenerationClient
    from spade_async.generation.protocol import SamplingParams
    from spade_async.loop.batcher import agent_batch
    from spade_async.roles.agent import AgentConfig
    from spade_async.roles.episode_routes import EpisodeRoutes
    from spade_async.trainer.route_sanity import prepare

    url, _ = server
    n = 4

    async def main():
        async with GenerationClient([url]) as client:
            client.enable_routes(SHAPE)
            state = [(EpisodeRoutes(client, f"ep-{i}"), list(range(40 + i, 52 + 2 * i)), [])
                     for i in range(n)]  # fmt: skip
            froms = [[] for _ in range(n)]
            for turn in range(2):
                if turn == 1:
                    await _update(client, str(dirs[1]), "1")

                async def one(i: int, turn: int = turn) -> None:
                    routes, ids, turns = state[i]
                    start = routes.start()
                    froms[i].append(start)
                    sp = SamplingParams(max_new_tokens=5 + i, ignore_eos=True, sampling_seed=i)
                    res = await client.generate(ids, sp, session_key=f"ep-{i}", routes_from=start)
                    routes.add(res, len(ids))
                    turns.append((len(ids), len(ids) + len(res.output_ids), res.weight_version))
                    ids += res.output_ids + [60 + turn, 61 + turn]  # an observation

                async with anyio.create_task_group() as tg:
                    for i in range(n):
                        tg.start_soon(one, i)
            return state, froms

    state, froms = anyio.run(main)
    episodes = []
    for (routes, ids, turns), start in zip(state, froms, strict=True):
        assert start[1] == 0 and routes.stale == 0  # the update was seen: asked from 0
        ids = ids[: turns[-1][1]]
        episodes.append(_episode(turns, ids, routes.finish()))
    batch = agent_batch(episodes, AgentConfig())
    samples = batch.samples
    assert len(samples) == 2 * n and batch.routes_stale == 0
    assert len({s.loss_group for s in samples}) == n  # one loss unit per episode
    p = prepare(samples, SHAPE)
    assert not any(p.free.values())  # every needed row is there and sane
    checked = 0
    for k, s in enumerate(samples):
        version = str(s.policy_version)
        last = max(i for i, m in enumerate(s.loss_mask) if m)
        rows = p.all_RLK[int(p.offset_N[k]) : int(p.offset_N[k]) + last].numpy()
        truth = _truth(models, version, s.token_ids[:last])
        assert (np.sort(rows, -1) == truth).all(), f"sample {k} (weights {version})"
        checked += last
    assert checked > 0
    # the old rule (turn 2 asks from the rows it has) keeps turn 1's rows for the prefix:
    # they are weights 0's, which did not sample turn 2
    ep = episodes[0]
    first_rows = np.frombuffer(ep.route_epochs[0][2], np.uint8).reshape(-1, 2, 2)
    truth_new = _truth(models, "1", ep.token_ids[: len(first_rows)])
    assert (np.sort(first_rows, -1) != truth_new).any()


def test_an_unseen_update_trains_the_turn_without_replay_and_counts_it():
    """A reply whose weights moved under the stored rows (the client had not seen it) or that
    ran across an update: that turn is its own epoch without rows; the next asks from 0."""
    from types import SimpleNamespace

    from spade_async.roles.episode_routes import EpisodeRoutes

    client = SimpleNamespace(route_shape=SHAPE, engine_version=lambda _k: None)
    r = EpisodeRoutes(client, "k")

    def reply(n_out, oldest, last, rows):
        return SimpleNamespace(routes_problem="", routed_experts=b"\x01" * (4 * rows),
                               output_ids=[1] * n_out, policy_version=oldest,
                               weight_version=last)  # fmt: skip

    assert r.start() == 0
    r.add(reply(3, "0", "0", 10 + 2), 10)  # rows 0..11
    assert r.start() == 12
    r.add(reply(3, "1", "1", 5), 15)  # weights moved unseen: stale
    assert r.start() == 0 and r.stale == 1
    r.add(reply(2, "1", "1", 21 + 1), 21)  # from 0 again
    r.add(reply(4, "1", "2", 4), 25)  # ran across an update: stale
    routed, epochs = r.finish()
    assert [(f, e, len(b)) for f, e, b in epochs] == [(0, 1, 48), (1, 2, 0), (2, 3, 88), (3, 4, 0)]
    assert r.stale == 2 and routed == b""


def test_engine_version_is_the_sessions_engines_or_the_newest_seen():
    from spade_async.generation.client import GenerationClient

    async def main():
        async with GenerationClient(["http://a", "http://b"]) as client:
            assert client.engine_version("k") is None
            url = client.pick("k")
            other = "http://b" if url == "http://a" else "http://a"
            client.saw_version(url, "3")
            client.saw_version(url, "2")  # a late reply of older weights: not back
            client.saw_version(other, "5")
            return client.engine_version("k"), client.engine_version("unpinned")

    assert anyio.run(main) == ("3", "5")


def test_a_designer_reply_across_an_update_trains_without_replay():
    from types import SimpleNamespace

    from spade_async.loop.batcher import routes_misfit
    from spade_async.roles.designer import _across_update

    across = SimpleNamespace(routed_experts=b"\x00" * 4, policy_version="0", weight_version="1")
    within = SimpleNamespace(routed_experts=b"\x00" * 4, policy_version="1", weight_version="1")
    assert _across_update(across) and not _across_update(within)
    assert not routes_misfit("stale") and routes_misfit("engine http://e: 3 token rows")
