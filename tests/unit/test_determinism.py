"""Runs that repeat (docs/determinism.md): request seeds, the CPU engine's deterministic mode,
the seeded ``n`` expansion, evaluation seeds, and the ``deterministic`` setting."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from spade_async import recipe
from spade_async.engines import CPUEngineServer, EngineConfig, servers
from spade_async.eval.engine import ClientGenerator
from spade_async.eval.types import Item, Sampling
from spade_async.generation.client import GenerationClient
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.seeds import SEED_BITS, request_seed
from spade_async.generation.server import make_engine_app, serve_in_thread


def test_request_seed_is_a_stable_hash_of_the_identity():
    a = request_seed(7, "agent", 3, "ab12", 5, 0)
    assert a == request_seed(7, "agent", 3, "ab12", 5, 0)  # same identity, same seed
    assert 0 <= a < 2**SEED_BITS
    others = {
        request_seed(8, "agent", 3, "ab12", 5, 0),  # another run seed
        request_seed(7, "hint", 3, "ab12", 5, 0),  # another role
        request_seed(7, "agent", 4, "ab12", 5, 0),  # another step
        request_seed(7, "agent", 3, "ab13", 5, 0),  # another environment
        request_seed(7, "agent", 3, "ab12", 6, 0),  # another slot
        request_seed(7, "agent", 3, "ab12", 5, 1),  # another turn
    }
    assert a not in others and len(others) == 6
    assert request_seed("a", "bc") != request_seed("ab", "c")  # parts never run together
    assert request_seed(1) != request_seed("1")


# ---- the CPU engine's deterministic mode ---------------------------------------------------
PROMPTS = [[1, 9690, 198, 67, 2], list(range(100, 131)), [5, 6, 7], list(range(300, 317))]


@pytest.fixture(scope="module")
def det_url(tiny_model):
    app = make_engine_app(str(tiny_model), context_length=96, deterministic=True)
    assert app.engine.max_running == 1 and app.engine.prefix.max_bytes == 0
    with serve_in_thread(app) as base:
        yield base


def _sp(seed: int | None, n: int = 1) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=6, temperature=1.0, ignore_eos=True, sampling_seed=seed, n=n
    )


async def _together(url: str, jobs: list[tuple[list[int], int | None]]) -> list:
    out: list = [None] * len(jobs)
    async with GenerationClient([url]) as client:

        async def one(i: int) -> None:
            prompt, seed = jobs[i]
            out[i] = await client.generate(prompt, _sp(seed))

        async with anyio.create_task_group() as tg:
            for i in range(len(jobs)):
                tg.start_soon(one, i)
    return out


async def _one_by_one(url: str, jobs: list[tuple[list[int], int | None]]) -> list:
    async with GenerationClient([url]) as client:
        return [await client.generate(prompt, _sp(seed)) for prompt, seed in jobs]


def test_deterministic_engine_answers_do_not_depend_on_arrival(det_url):
    """Eight requests sent at once, then one at a time in reverse: every token and every
    log-prob bit the same (batching order, padding and the prefix cache cannot leak in)."""
    jobs = [(p, 11 + i) for i, p in enumerate(PROMPTS)] * 2  # each prompt twice (a turn's
    together = anyio.run(_together, det_url, jobs)  # later request could hit the cache)
    apart = anyio.run(_one_by_one, det_url, jobs[::-1])[::-1]
    for a, b in zip(together, apart, strict=True):
        assert a.output_ids == b.output_ids
        assert a.logprobs == b.logprobs  # bit for bit, not a tolerance
    assert together[0].output_ids == together[len(PROMPTS)].output_ids  # one prompt + seed


def test_deterministic_engine_seeds_an_unseeded_request_from_its_prompt(det_url):
    first = anyio.run(_one_by_one, det_url, [(PROMPTS[1], None)] * 2)
    assert first[0].output_ids == first[1].output_ids  # never the wall clock


def test_seeded_n_is_n_requests_with_seeds_seed_plus_i(det_url):
    """SGLang samples from (seed, position): one seeded request with n = 3 would give three
    copies. The client sends n requests seeded seed + i, which the CPU engine's own n
    expansion matches."""

    async def main():
        async with GenerationClient([det_url]) as client:
            group = await client.generate_n(PROMPTS[0], _sp(40, n=3))
            singles = [await client.generate(PROMPTS[0], _sp(40 + i)) for i in range(3)]
        return group, singles

    group, singles = anyio.run(main)
    assert [r.output_ids for r in group] == [r.output_ids for r in singles]
    assert len({tuple(r.output_ids) for r in group}) > 1  # not n copies of one draw


# ---- evaluation requests --------------------------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def generate(self, ids, params, return_logprob=False):
        self.seeds.append(params.sampling_seed)
        return SimpleNamespace(text="x")


class _Tok:
    chat_template = ""

    def apply_chat_template(self, messages, **kw):
        return [1, 2, len(messages[-1]["content"])]


def test_eval_requests_carry_seeds_by_item_prompt_and_ask(monkeypatch):
    import spade_async.eval.engine as eval_engine

    monkeypatch.setattr(
        eval_engine, "render_prompt", lambda tok, m, **kw: [1, len(m[-1]["content"])]
    )
    item_a = Item(id="a", messages=[{"role": "user", "content": "q"}], answer="1")
    item_b = Item(id="b", messages=[{"role": "user", "content": "q"}], answer="1")

    async def asks(gen):
        for item in (item_a, item_a, item_b, item_a):  # n = 3 samples of a, one of b
            await gen(item.messages, Sampling(), item=item)

    rec = _Recorder()
    anyio.run(asks, ClientGenerator(rec, _Tok(), seed=5))
    a0, a1, b0, a2 = rec.seeds
    assert None not in rec.seeds and len(set(rec.seeds)) == 4  # every ask its own seed
    again = _Recorder()
    anyio.run(asks, ClientGenerator(again, _Tok(), seed=5))
    assert again.seeds == rec.seeds  # a new evaluation draws the same seeds
    other = _Recorder()
    anyio.run(asks, ClientGenerator(other, _Tok(), seed=6))
    assert not set(other.seeds) & set(rec.seeds)  # another run seed, other seeds


# ---- the run's setting ----------------------------------------------------------------------
def test_deterministic_setting_reaches_the_engines(tmp_path):
    cfg = recipe.load(None, ["deterministic=true", "telemetry.dashboard='off'"])
    assert cfg.engine.deterministic
    (server,) = servers(cfg.engine, tmp_path, tmp_path)
    assert isinstance(server, CPUEngineServer)
    assert "--deterministic" in server.argv
    assert server.env == {"OMP_NUM_THREADS": "1"}  # the thread count is fixed
    (plain,) = servers(EngineConfig(), tmp_path, tmp_path)
    assert "--deterministic" not in plain.argv and plain.env == {}
