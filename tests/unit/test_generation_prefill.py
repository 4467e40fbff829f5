"""CPU engine batching internals: length-grouped prefill, shared prompts, the in-place KV
buffer, and the candidate-window sampler, each checked against a float64 teacher-forced
reference of the same tiny model."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

from spade_async.generation.engine import Engine, Sequence, _length_groups
from spade_async.generation.logprob_convention import token_logprobs
from spade_async.generation.protocol import SamplingParams
from spade_async.models import load_causal_lm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import EPS32, logit_bound, reduction_bound  # noqa: E402

SHORT, LONG, MID = [1, 9690, 198, 67, 2], list(range(100, 131)), list(range(300, 317))


def _seq(rid: str, prompt: list[int], n: int, seed: int, **kw) -> Sequence:
    params = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True, **kw)
    return Sequence(rid=rid, prompt_ids=prompt, params=params, max_new=n, stop_ids=frozenset(),
                    generator=torch.Generator().manual_seed(seed))  # fmt: skip


def test_length_groups_bound_padding_and_keep_every_sequence():
    seqs = [
        _seq(str(i), [7] * n, 4, i)
        for i, n in enumerate([86, 579, 170, 116, 143, 138, 232, 188, 86])
    ]
    groups = _length_groups(seqs)
    assert sorted(s.rid for g in groups for s in g) == sorted(s.rid for s in seqs)
    for g in groups:
        real = sum(len(s.prompt_ids) for s in g)
        assert len(g) * max(len(s.prompt_ids) for s in g) <= 1.25 * real
    assert [s.rid for s in groups[-1]] == ["1"]  # the 579-token prompt pads nobody


def test_shared_prompts_and_buffer_growth_match_teacher_forcing(tiny_model):
    """Three samples of one prompt (prefilled once), two other lengths, 70 new tokens each
    (past the KV buffer's first spare room, so it grows in place and through row removal):
    every reported log-prob equals the float64 teacher-forced one within the float32 bound."""
    model, tok = load_causal_lm(str(tiny_model))
    engine = Engine(model.eval(), tok)
    seqs = [_seq("a0", SHORT, 70, 0, top_p=0.9), _seq("a1", SHORT, 70, 1, top_p=0.9),
            _seq("a2", SHORT, 70, 2), _seq("b", LONG, 50, 3, top_k=40), _seq("c", MID, 70, 4)]  # fmt: skip
    engine.submit(seqs)  # all pending before the scheduler starts: one prefill round
    engine.start()
    try:
        done = {s.rid: s.future.result(timeout=120) for s in seqs}
    finally:
        engine.stop()
    assert engine.stats["prefill_tokens"] == len(SHORT) + len(LONG) + len(MID)  # SHORT once
    assert len({tuple(done[r].output_ids) for r in ("a0", "a1", "a2")}) == 3  # own seeds

    ref = model.double()
    cfg = model.config
    worst = 0.0
    for s in done.values():
        ids = torch.tensor([s.prompt_ids + s.output_ids])
        with torch.no_grad():
            logits_TV = ref(input_ids=ids).logits[0]
        start = len(s.prompt_ids) - 1
        want = token_logprobs(
            logits_TV[start : start + len(s.output_ids)], torch.tensor(s.output_ids), 1.0
        )
        got = torch.tensor(s.logprobs, dtype=torch.float64)
        zmax = float(logits_TV.abs().max())
        T = ids.shape[1]
        layer = [cfg.hidden_size, T, cfg.hidden_size, cfg.intermediate_size]
        bound = logit_bound(
            EPS32, zmax, *(layer * cfg.num_hidden_layers), cfg.hidden_size, cfg.vocab_size
        )
        err = float((got - want).abs().max())
        worst = max(worst, err / bound)
        assert err <= bound, (s.rid, err, bound)
        if s.params.top_k > 0:  # drawn tokens stay inside the truncation
            topk_T = (
                logits_TV[start : start + len(s.output_ids)].topk(s.params.top_k, dim=1).indices
            )
            assert all(t in row for t, row in zip(s.output_ids, topk_T.tolist(), strict=True))
    assert worst > 0  # the check compares real numbers


def test_ragged_plan_ranges():
    from spade_async.generation.ragged import MAX_RANGES, plan_ranges

    assert plan_ranges([0, 0, 0], 100) == [(0, 3, 0)]
    # 100 real columns for row 0, 20 for rows 1-2: they would read 80 padding columns
    assert plan_ranges([0, 80, 80], 100) == [(0, 1, 0), (1, 3, 80)]
    many = plan_ranges([0, 50, 75, 88, 94, 97, 99], 100)
    assert len(many) <= MAX_RANGES and many[0][:2] == (0, 1) and many[-1][1] == 7
    assert all(a[1] == b[0] for a, b in itertools.pairwise(many))  # contiguous cover


def test_ragged_decode_attention_equals_sdpa(tiny_model):
    """One decode step over left-padded rows: the ragged path (row ranges on views) gives
    SDPA's output over the full padded width, in float64 (only summation order differs)."""
    from transformers import DynamicCache

    from spade_async.generation import ragged
    from spade_async.generation.kv_cache import cache_kw

    model, _ = load_causal_lm(str(tiny_model))
    model = model.double().eval()
    assert ragged.enable(model) and model.config._attn_implementation == ragged.NAME
    lengths = [40, 38, 12, 11, 3]  # sorted longest first, as the engine keeps them
    T = max(lengths)
    gen = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(10, 1000, (len(lengths), T), generator=gen)
    mask_BT = torch.zeros((len(lengths), T), dtype=torch.long)
    for b, n in enumerate(lengths):
        mask_BT[b, T - n :] = 1
    pos_BT = (mask_BT.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        plain = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits[:, -1]
        with ragged.using_plan(mask_BT[:, :-1]):  # a plan for another width is ignored
            ignored = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits[
                :, -1
            ]
        cache = {cache_kw(model): DynamicCache()}
        model(input_ids=ids_BT[:, :-1], attention_mask=mask_BT[:, :-1], position_ids=pos_BT[:, :-1],
              use_cache=True, **cache)  # fmt: skip
        with ragged.using_plan(mask_BT):
            step = model(input_ids=ids_BT[:, -1:], attention_mask=mask_BT, position_ids=pos_BT[:, -1:],
                         use_cache=True, **cache).logits[:, -1]  # fmt: skip
    assert len(ragged.plan_ranges((T - mask_BT.sum(1)).tolist(), T)) > 1  # the ragged path ran
    assert torch.equal(plain, ignored)
    cfg = model.config  # float64 throughout: only the order of the sums differs
    layer = [cfg.hidden_size, T, cfg.hidden_size, cfg.intermediate_size]
    bound = logit_bound(torch.finfo(torch.float64).eps, float(plain.abs().max()),
                        *(layer * cfg.num_hidden_layers), cfg.hidden_size)  # fmt: skip
    assert 0 < float((step - plain).abs().max()) <= bound or torch.equal(step, plain)


def test_packed_linear_is_used_only_while_its_weight_is_current(tiny_model):
    from torch import nn

    from spade_async.generation import packed

    model, tok = load_causal_lm(str(tiny_model))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    engine = Engine(model.eval(), tok)  # packs on start
    assert packed.packed_layers(engine.model) == len(linears) > 0
    layer = linears[0]
    x = torch.randn(3, 5, layer.in_features, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.linear(x.double(), layer.weight.double())
    # float32 rounding of K-term dot products, element-wise: reduction_bound(K) * sum |x_i w_i|
    size = x.double().abs() @ layer.weight.detach().double().abs().T
    bound = reduction_bound(layer.in_features) * size + EPS32 * want.abs()
    with torch.no_grad():
        assert bool(((layer(x) - want).abs() <= bound).all())
        layer.weight.mul_(2.0)  # an in-place update: the pack is stale, the layer must not use it
        assert packed.packed_layers(engine.model) == len(linears) - 1
        assert bool(((layer(x) - 2 * want).abs() <= 2 * bound).all())
    engine.release_memory(["weights"])
    assert packed.packed_layers(engine.model) == 0


@pytest.mark.parametrize("rows", [1, 2, 33])
def test_packed_linear_with_bias_and_strided_input_matches_float64(rows):
    """The packed path (oneDNN, dense in and out where torch has it) takes a bias and inputs
    that are not contiguous, at every row count (one row runs another kernel)."""
    from torch import nn

    from spade_async.generation import packed

    gen = torch.Generator().manual_seed(rows)
    layer = nn.Linear(40, 24, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(24, 40, generator=gen))
        layer.bias.copy_(torch.randn(24, generator=gen))
    assert packed.pack(layer) == (1 if torch.backends.mkldnn.is_available() else 0)
    x = torch.randn(40, rows, generator=gen).T  # (rows, 40), not contiguous
    want = x.double() @ layer.weight.detach().double().T + layer.bias.detach().double()
    size = x.double().abs() @ layer.weight.detach().double().abs().T + layer.bias.double().abs()
    bound = reduction_bound(41) * size + EPS32 * want.abs()
    with torch.no_grad():
        got = layer(x)
        got3 = layer(x.reshape(1, rows, 40))
    assert got.shape == (rows, 24) and got3.shape == (1, rows, 24)
    assert bool(((got - want).abs() <= bound).all())
    assert bool(((got3[0] - want).abs() <= bound).all())
