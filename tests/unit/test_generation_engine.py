"""CPU engine + client against a tiny random Llama, served in-process over real HTTP."""

from __future__ import annotations

import contextlib

import anyio
import httpx
import pytest
import torch

from spade_async.generation.client import (
    ClientConfig,
    EngineError,
    EngineRequestError,
    GenerationClient,
)
from spade_async.generation.logprob_convention import token_logprobs
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.server import make_engine_app, serve_in_thread
from spade_async.models import load_causal_lm, tiny_model_dir


@pytest.fixture(scope="module")
def engine_app(tiny_model):
    return make_engine_app(str(tiny_model), context_length=96)


@pytest.fixture(scope="module")
def url(engine_app):
    with serve_in_thread(engine_app) as base:
        yield base


@pytest.fixture(scope="module")
def reference(tiny_model):
    model, _ = load_causal_lm(str(tiny_model))
    return model


def _run(fn, *args):
    return anyio.run(fn, *args)


def _teacher_forced(model, prompt, output, temperature):
    ids_1T = torch.tensor([prompt + output])
    with torch.no_grad():
        logits_TV = model(input_ids=ids_1T).logits[0]
    start = len(prompt) - 1
    return token_logprobs(logits_TV[start : start + len(output)], torch.tensor(output), temperature)


PROMPTS = [[1, 9690, 198, 67, 2], list(range(100, 131)), [5, 6, 7], list(range(300, 317))]


def test_logprobs_match_teacher_forcing_under_concurrent_batching(url, engine_app, reference):
    """Different prompt lengths arrive together: left padding, cache merging and row removal
    must not change a single log-prob (fp32, 1e-4)."""
    temps = [0.7, 1.0, 0.0, 1.3]
    results = {}

    async def main():
        async with GenerationClient([url]) as client:
            async def one(i):
                sp = SamplingParams(max_new_tokens=6 + 3 * i, temperature=temps[i], sampling_seed=i,
                                    ignore_eos=True)
                results[i] = await client.generate(PROMPTS[i], sp)

            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)

    before = engine_app.engine.stats["max_batch"]
    _run(main)
    assert engine_app.engine.stats["max_batch"] >= 2 or before >= 2
    for i, res in results.items():
        assert len(res.output_ids) == 6 + 3 * i and res.finish_reason == "length"
        ref = _teacher_forced(reference, PROMPTS[i], res.output_ids, temps[i])
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4), (i, res.logprobs, ref)


def test_greedy_matches_transformers_generate(url, reference):
    prompt = PROMPTS[1]

    async def main():
        async with GenerationClient([url]) as client:
            return await client.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))

    res = _run(main)
    with torch.no_grad():
        ref = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    assert res.output_ids == ref[0, len(prompt):].tolist()


def test_seeded_sampling_and_n(url):
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.9, sampling_seed=7, n=3,
                        ignore_eos=True)

    async def main():
        async with GenerationClient([url]) as client:
            return await client.generate_n(PROMPTS[0], sp), await client.generate_n(PROMPTS[0], sp)

    first, second = _run(main)
    assert len(first) == 3 and [r.output_ids for r in first] == [r.output_ids for r in second]
    assert len({tuple(r.output_ids) for r in first}) > 1  # different seeds per sample


def test_stop_token_and_stop_string(url, engine_app):
    tok = engine_app.engine.tokenizer
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)

    async def gen(sp):
        async with GenerationClient([url]) as client:
            return await client.generate(PROMPTS[3], sp)

    base = _run(gen, greedy).output_ids
    stop_id = base[5]
    res = _run(gen, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True,
                                   stop_token_ids=[stop_id]))
    cut = base.index(stop_id) + 1
    assert res.output_ids == base[:cut] and res.finish_reason == "stop" and res.matched == stop_id

    full_text = tok.decode(base, skip_special_tokens=False)
    piece = tok.decode(base[6:8], skip_special_tokens=False)
    res = _run(gen, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True, stop=[piece]))
    assert res.finish_reason == "stop" and res.matched == piece
    assert res.output_ids == base[: len(res.output_ids)] and len(res.output_ids) <= 8
    assert res.text == tok.decode(res.output_ids, skip_special_tokens=True)[: full_text.find(piece)] or piece not in res.text


def test_batch_input_ids_returns_a_list(url):
    body = {"input_ids": [PROMPTS[0], PROMPTS[2]],
            "sampling_params": {"max_new_tokens": 3, "temperature": 0, "n": 2, "ignore_eos": True},
            "return_logprob": True}
    out = httpx.post(url + "/generate", json=body, timeout=60).json()
    assert isinstance(out, list) and len(out) == 4
    assert out[0]["output_ids"] == out[1]["output_ids"]  # greedy, same prompt
    assert out[0]["meta_info"]["prompt_tokens"] == len(PROMPTS[0])
    assert out[2]["meta_info"]["prompt_tokens"] == len(PROMPTS[2])
    lp = out[0]["meta_info"]["output_token_logprobs"]
    assert len(lp) == 3 and lp[0][1] == out[0]["output_ids"][0] and lp[0][2] is None


def test_too_long_prompt_fails_only_that_request(url):
    async def main():
        async with GenerationClient([url]) as client:
            ok = await client.generate(PROMPTS[0], SamplingParams(max_new_tokens=200, temperature=0))
            with pytest.raises(EngineRequestError, match="context length is 96"):
                await client.generate(list(range(10, 120)), SamplingParams(max_new_tokens=2))
            return ok

    ok = _run(main)
    assert len(PROMPTS[0]) + len(ok.output_ids) <= 96  # clamped to the context
    bad = httpx.post(url + "/generate", json={"input_ids": [1], "sampling_params": {"bogus": 1}})
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]["message"]


def test_pause_and_continue(url):
    async def main():
        async with GenerationClient([url]) as client:
            await client.pause(mode="in_place")
            done = []

            async def one():
                done.append(await client.generate(PROMPTS[2], SamplingParams(max_new_tokens=3, temperature=0)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                await anyio.sleep(0.5)
                assert not done  # paused: nothing runs
                await client.resume()
            return done

    assert len(_run(main)) == 1


def test_update_weights_from_disk_success_and_failure(url, tmp_path, tiny_model):
    other = tiny_model_dir(tmp_path / "other", seed=1)
    new_model, _ = load_causal_lm(str(other))
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)

    async def main():
        async with GenerationClient([url]) as client:
            before = await client.generate(PROMPTS[0], sp)
            v0 = (await client.weight_versions())[url]
            with pytest.raises(EngineError, match="failed to load"):
                await client.update_weights_from_disk(str(tmp_path / "missing"))
            same = await client.generate(PROMPTS[0], sp)
            versions = await client.update_weights_from_disk(str(other))
            after = await client.generate(PROMPTS[0], sp)
            named = await client.update_weights_from_disk(str(tiny_model), weight_version="step-9")
            return before, v0, same, versions, after, named

    before, v0, same, versions, after, named = _run(main)
    assert same.output_ids == before.output_ids and same.weight_version == v0
    assert versions[url] == str(int(v0) + 1) and after.weight_version == versions[url]
    with torch.no_grad():
        ref = new_model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=6, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    assert after.output_ids == ref[0, len(PROMPTS[0]):].tolist()
    assert named[url] == "step-9"


def test_health_and_routing(url):
    dead = "http://127.0.0.1:9"
    cfg = ClientConfig(max_retries=0, health_timeout_s=2.0)

    async def main():
        async with GenerationClient([url, dead], cfg) as client:
            status = await client.check_health()
            picks = {client.pick(f"s{i}") for i in range(5)}
            res = await client.generate(PROMPTS[2], SamplingParams(max_new_tokens=2), session_key="ep1")
            return status, picks, res

    status, picks, res = _run(main)
    assert status == {url: True, dead: False}
    assert picks == {url} and res.url == url


def test_logprobs_match_the_trainers_policy_model(url, tiny_model):
    """Same weights through the trainer's own log-prob path (fused kernel), fp32, 1e-4."""
    trainer_model = pytest.importorskip("spade_async.trainer.model")
    prompt, temperature = PROMPTS[1], 0.6

    async def main():
        async with GenerationClient([url]) as client:
            sp = SamplingParams(max_new_tokens=10, temperature=temperature, sampling_seed=3, ignore_eos=True)
            return await client.generate(prompt, sp)

    res = _run(main)
    causal_lm, _ = load_causal_lm(str(tiny_model))
    policy = trainer_model.PolicyModel(causal_lm, temperature)
    ids = prompt + res.output_ids
    ids_1T = torch.tensor([ids])
    target_T = torch.tensor(ids[1:] + [0])
    with torch.no_grad():
        logprob_T = policy(ids_1T, torch.arange(len(ids)).unsqueeze(0), target_T)
    trainer_lp = logprob_T[len(prompt) - 1 : len(ids) - 1]
    assert torch.allclose(torch.tensor(res.logprobs), trainer_lp.float(), atol=1e-4)


def test_weight_update_while_paused_in_place(url, engine_app, tmp_path, tiny_model):
    """The RL push: pause in place, load new weights, continue; the in-flight request
    finishes and reports the new version (no deadlock waiting for it to drain); as SGLang,
    its meta_info spans say which tokens came from the old weights, so its policy version
    (for staleness and importance weights) is the old one."""
    other = tiny_model_dir(tmp_path / "pushed", seed=2)
    before = engine_app.engine.weight_version

    async def main():
        async with GenerationClient([url]) as client:
            done = []

            async def one():
                sp = SamplingParams(max_new_tokens=90, temperature=0.0, ignore_eos=True)
                done.append(await client.generate(PROMPTS[2], sp))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                with anyio.fail_after(60):
                    while not (  # wait until it is mid-generation
                        engine_app.engine.active and engine_app.engine.active[0].output_ids
                    ):
                        await anyio.sleep(0.01)
                await client.pause(mode="in_place")
                with anyio.fail_after(60):
                    versions = await client.update_weights_from_disk(
                        str(other), weight_version="pushed", flush_cache=False
                    )  # SGLang refuses the flush with requests in the running batch
                await client.resume()
            await client.update_weights_from_disk(str(tiny_model), weight_version="0")
            return done[0], versions

    res, versions = _run(main)
    assert versions[url] == "pushed" and res.weight_version == "pushed"
    assert res.policy_version == before != "pushed"
    assert len(res.output_ids) == 90 and res.finish_reason == "length"


def test_release_and_resume_memory_around_a_weight_update(url, engine_app, tiny_model):
    """The colocated sequence: release all -> (train) -> resume weights -> push -> resume
    the rest, each resume naming its tags (SGLang's offload-set bookkeeping)."""
    sp = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    engine = engine_app.engine

    async def main():
        async with GenerationClient([url], ClientConfig(max_retries=0)) as client:
            before = await client.generate(PROMPTS[0], sp)
            await client.release_memory()
            freed = sum(p.numel() for p in engine.model.parameters())
            with pytest.raises(EngineRequestError, match="resume_memory_occupation"):
                await client.generate(PROMPTS[0], sp)
            await client.resume_memory(["weights"])
            shapes_back = all(p.numel() > 0 for p in engine.model.parameters())
            await client.update_weights_from_disk(str(tiny_model))
            half = set(engine.released), set(engine_app.sgl.offload_tags)
            await client.resume_memory(["kv_cache", "cuda_graph"])
            after = await client.generate(PROMPTS[0], sp)
            return before, freed, shapes_back, half, after

    before, freed, shapes_back, half, after = _run(main)
    assert freed == 0 and shapes_back
    assert half == ({"kv_cache", "cuda_graph"},) * 2 and not engine.released
    assert after.output_ids == before.output_ids  # the pushed weights serve again


@pytest.mark.parametrize(
    "planted",
    [
        pytest.param(
            [("release", None), ("resume", ["weights"]), ("resume", None)],
            id="resume-all-after-weights",
        ),
        pytest.param(
            [("release", ["kv_cache"]), ("resume", ["kv_cache"]), ("resume", ["kv_cache"])],
            id="double-resume",
        ),
        pytest.param([("resume", ["gpu"])], id="unknown-tag-never-released"),
    ],
)
def test_illegal_resume_kills_the_engine_as_it_kills_sglang(tiny_model, planted):
    """SGLang's resume_memory_occupation removes each tag from its offload set and raises
    KeyError (its scheduler dies) for one that is not there; the CPU engine dies with it:
    every later call fails, /health answers 503."""
    app = make_engine_app(str(tiny_model), context_length=32)
    with serve_in_thread(app) as base:

        async def main():
            async with GenerationClient([base], ClientConfig(max_retries=0)) as client:
                *legal, (_, bad) = planted
                for what, tags in legal:
                    await getattr(client, f"{what}_memory")(tags)
                with pytest.raises(EngineError, match="KeyError"):
                    await client.resume_memory(bad)
                with pytest.raises(EngineError, match="server died"):
                    await client.generate([1, 2], SamplingParams(max_new_tokens=1))
                return await client.check_health()

        assert _run(main) == {base: False}
    assert app.sgl.dead and app.sgl.calls[-1].ok is False


def test_release_memory_on_a_busy_engine_kills_it_as_sglang(tiny_model):
    """SGLang asserts an idle server in release_memory_occupation (its scheduler dies): a
    request decoding when an in_place pause came stays in the running batch."""
    app = make_engine_app(str(tiny_model), context_length=96)
    with serve_in_thread(app) as base:

        async def main():
            async with GenerationClient([base], ClientConfig(max_retries=0)) as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_quiet_generate, client)
                    with anyio.fail_after(30):
                        while not (app.engine.active and app.engine.active[0].output_ids):
                            await anyio.sleep(0.01)
                    await client.pause(mode="in_place")
                    with pytest.raises(EngineError, match="idle"):
                        await client.release_memory(["kv_cache"])
                    tg.cancel_scope.cancel()

        _run(main)
    assert "release_memory_occupation" in app.sgl.dead


async def _quiet_generate(client):
    with contextlib.suppress(EngineError):
        await client.generate(PROMPTS[2], SamplingParams(max_new_tokens=80, ignore_eos=True))


def test_weight_updates_load_into_a_spare_model(url, engine_app, tmp_path, tiny_model):
    """Same names and shapes: the checkpoint is copied into a spare copy of the serving model
    (no model construction), and the two copies swap roles on each update."""
    other = tiny_model_dir(tmp_path / "other", seed=3)
    sp = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    engine = engine_app.engine

    async def main():
        async with GenerationClient([url]) as client:
            first = engine.model
            await client.update_weights_from_disk(str(other))
            second = engine.model
            flipped = engine_app._spare is first
            on_other = await client.generate(PROMPTS[0], sp)
            await client.update_weights_from_disk(str(tiny_model))
            return first, second, flipped, engine.model, on_other

    first, second, flipped, third, on_other = _run(main)
    assert second is not first and flipped and third is first
    ref, _ = load_causal_lm(str(other))
    with torch.no_grad():
        out = ref.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=4, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert on_other.output_ids == out[0, len(PROMPTS[0]):].tolist()


def test_logprobs_under_the_recipes_sampling_are_temperature_scaled_and_unfiltered(
    url, reference
):
    """The recipes sample at T 0.6 with top_p 0.95 / top_k 20. The engine reports, as
    SGLang does without SGLANG_RETURN_ORIGINAL_LOGPROB, log_softmax(logits / 0.6) before the
    filters; the trainer recomputes at trainer.temperature = 0.6, so the PPO ratio and the
    TIS weight compare like with like. The reference's slime trainer divides by
    --rollout-temperature 1.0 instead: a different number, which we do not copy."""
    sp = SamplingParams(max_new_tokens=8, temperature=0.6, top_p=0.95, top_k=20,
                        sampling_seed=3, ignore_eos=True)  # fmt: skip

    async def main():
        async with GenerationClient([url]) as client:
            return await client.generate(PROMPTS[2], sp)

    res = _run(main)
    got = torch.tensor(res.logprobs)
    at_06 = _teacher_forced(reference, PROMPTS[2], res.output_ids, 0.6)
    at_1 = _teacher_forced(reference, PROMPTS[2], res.output_ids, 1.0)
    assert torch.allclose(got, at_06, atol=1e-4), (got, at_06)  # fp32, as the test above
    assert (got - at_1).abs().max() > 1e-2  # T = 1 (slime's convention) is another number
    # and not the filtered distribution: renormalising over the top 20 raises every log-prob
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[2] + res.output_ids])
        logits = reference(input_ids=ids).logits[0, len(PROMPTS[2]) - 1 : -1] / 0.6
    top20 = logits.log_softmax(-1).topk(20, dim=-1).values.logsumexp(-1)
    assert (top20 < -1e-2).all()  # the top 20 hold less than all the mass: filtering would move it
