"""The CPU engine's prefix cache: the next turn of a conversation prefills only its new
tokens over the KV its last turn left, with the numbers of a full prefill; KV computed under
other weights, or flushed, or released, is never reused; the byte budget holds."""

from __future__ import annotations

import copy

import torch

from spade_async.generation.engine import Engine, Sequence
from spade_async.generation.kv_cache import PrefixCache
from spade_async.generation.logprob_convention import sampling_logprobs
from spade_async.generation.protocol import SamplingParams
from spade_async.models import load_causal_lm

EPS32 = torch.finfo(torch.float32).eps


def _seq(rid: str, prompt: list[int], new: int, seed: int = 0) -> Sequence:
    params = SamplingParams(temperature=1.0, max_new_tokens=new)
    gen = torch.Generator().manual_seed(seed)
    return Sequence(rid, list(prompt), params, new, frozenset(), gen)


def _run(engine: Engine, seqs: list[Sequence]) -> list[Sequence]:
    engine.submit(seqs)
    return [s.future.result(timeout=120) for s in seqs]


def _conversation(engine: Engine, turns: int = 3, rows: int = 6) -> list[list[Sequence]]:
    """``rows`` conversations of ``turns`` turns; each turn's prompt is the last turn's prompt
    and reply, then an observation whose length differs by row (so rows of one prefill
    compute different numbers of new tokens, and one row's whole context is short)."""
    prompts = [[(11 * r + 7 * j) % 900 + 20 for j in range(3 + 9 * r)] for r in range(rows)]
    out = []
    for turn in range(turns):
        done = _run(engine, [_seq(f"{turn}-{r}", p, 5, 100 * turn + r) for r, p in enumerate(prompts)])
        out.append(done)
        prompts = [s.prompt_ids + s.output_ids + [30 + t for t in range(1 + (r * 5) % 11)]
                   for r, s in enumerate(done)]  # fmt: skip
    return out


def _reference_logprobs(model64, seq: Sequence) -> torch.Tensor:
    """float64 log-probs of ``seq``'s own output tokens given its prompt (teacher forced)."""
    ids = torch.tensor([seq.prompt_ids + seq.output_ids])
    with torch.no_grad():
        logits = model64(input_ids=ids).logits[0, len(seq.prompt_ids) - 1 : -1]
    lp = sampling_logprobs(logits, seq.params.temperature).double()
    return lp.gather(1, torch.tensor(seq.output_ids).unsqueeze(1)).squeeze(1)


def test_later_turns_reuse_the_kv_with_the_numbers_of_a_full_prefill(tiny_model):
    model, tok = load_causal_lm(str(tiny_model))
    model64 = copy.deepcopy(model).double()
    warm = Engine(model, tok)
    cold = Engine(copy.deepcopy(model), tok, prefix_cache_bytes=0)
    for e in (warm, cold):
        e.start()
    try:
        warm_turns, cold_turns = _conversation(warm), _conversation(cold)
    finally:
        warm.stop()
        cold.stop()
    assert cold.stats["prefix_hit_tokens"] == 0
    # turns 2 and 3 of every row found their last turn's KV, short rows included
    assert warm.prefix.stats["hits"] == 12 and warm.stats["prefix_hit_tokens"] > 0
    assert warm.stats["prefill_tokens"] < cold.stats["prefill_tokens"]
    # each engine's reported log-probs against float64 on its own tokens: reuse may not be
    # less accurate than recomputing (a misplaced position, mask or row is off by O(1))
    for turn in (1, 2):
        err = {}
        for name, turns in (("warm", warm_turns), ("cold", cold_turns)):
            err[name] = max(
                float((torch.tensor(s.logprobs, dtype=torch.float64) - _reference_logprobs(model64, s)).abs().max())
                for s in turns[turn]
            )  # fmt: skip
        assert err["warm"] <= 4 * err["cold"] + 64 * EPS32, (turn, err)


def test_new_weights_a_flush_or_a_release_drop_the_cache(tiny_model):
    model, tok = load_causal_lm(str(tiny_model))
    engine = Engine(model, tok)
    engine.start()
    try:
        prompt = list(range(40, 60))

        def first_turn() -> list[int]:  # same seed, same weights' values: same reply
            (first,) = _run(engine, [_seq("a", prompt, 4, seed=3)])
            return first.output_ids

        reply = first_turn()
        follow = prompt + reply + [7, 8]
        assert len(engine.prefix) == 1

        def hits_for_follow_up() -> int:
            before = engine.prefix.stats["hits"]
            _run(engine, [_seq("b", follow, 2)])
            return engine.prefix.stats["hits"] - before

        assert hits_for_follow_up() == 1
        # new weights (the same values, another version): version 0's KV is not reused
        engine.swap_model(copy.deepcopy(model), "1", abort=False).result(timeout=60)
        assert hits_for_follow_up() == 0
        assert first_turn() == reply and hits_for_follow_up() == 1
        engine.flush_prefix_cache()
        assert hits_for_follow_up() == 0
        assert first_turn() == reply and hits_for_follow_up() == 1
        engine.release_memory(["kv_cache"])
        engine.resume_memory(["kv_cache"])
        assert hits_for_follow_up() == 0
    finally:
        engine.stop()


def test_a_request_that_ran_across_an_in_place_swap_is_not_kept(tiny_model):
    """Paused in place, a running row keeps its KV across a weight swap and finishes on the
    new weights (SGLang's in_place): its KV is part old weights, so it must not be kept."""
    import time

    model, tok = load_causal_lm(str(tiny_model))
    engine = Engine(model, tok)
    engine.start()
    try:
        seq = _seq("long", list(range(30, 50)), 60)
        engine.submit([seq])
        deadline = time.monotonic() + 60
        while not (engine.active and engine.active[0].output_ids):
            assert time.monotonic() < deadline, "the request never started decoding"
            time.sleep(0.005)
        engine.pause(abort=False)
        engine.swap_model(copy.deepcopy(model), "1", abort=False).result(timeout=60)
        engine.resume()
        seq.future.result(timeout=120)
        assert [v for v, _ in seq.version_events][:1] == ["0"]  # it did straddle the swap
        assert len(engine.prefix) == 0
        (short,) = _run(engine, [_seq("short", list(range(30, 40)), 3)])
        assert len(engine.prefix) == 1  # one that ran on one version is kept
    finally:
        engine.stop()


def test_a_context_the_cache_holds_whole_still_computes_its_last_token(tiny_model):
    model, tok = load_causal_lm(str(tiny_model))
    engine = Engine(model, tok)
    engine.start()
    try:
        (a,) = _run(engine, [_seq("a", list(range(50, 70)), 3, seed=1)])
        again = a.prompt_ids + a.output_ids[:-1]  # exactly the cached tokens
        (b,) = _run(engine, [_seq("b", again, 3, seed=2)])
        assert len(b.output_ids) == 3 and len(b.logprobs) == 3
        assert all(lp <= 0 for lp in b.logprobs)
    finally:
        engine.stop()


def test_aborted_requests_leave_nothing_and_the_budget_evicts_the_oldest():
    cache = PrefixCache(max_bytes=3 * 2 * 4 * 8)  # three 4-token entries of 1 x 4 x 2 floats

    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    for first in (1, 2, 3):
        cache.put((first, 9, 9, 9), kv(4))
    assert cache.longest([2, 9, 9, 9, 5])[0] == 4  # touches entry 2
    cache.put((4, 9, 9, 9), kv(4))  # over budget: entry 1, the least recently used, goes
    assert cache.longest([1, 9, 9, 9, 5]) == (0, None)
    assert cache.longest([2, 9, 9, 9, 5])[0] == 4 and cache.stats["evictions"] == 1
    assert cache.longest([2, 9, 9, 9]) == (0, None)  # would leave no token to compute
    cache.put((5,) * 40, kv(40))  # larger than the whole budget: not kept
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
