"""Batched sampler: exact categorical draws, truncation rules, per-request reproducibility."""

from __future__ import annotations

import torch

from spade_async.generation.engine import sample_tokens
from spade_async.generation.logprob_convention import sampling_logprobs
from spade_async.generation.protocol import SamplingParams


def _draw(logits_V, params, n, seed=0):
    logprobs_BV = sampling_logprobs(logits_V.expand(n, -1), params.temperature)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(n)]
    return sample_tokens(logprobs_BV, [params] * n, gens)


def test_frequencies_match_temperature_scaled_probabilities():
    logits_V = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    params = SamplingParams(temperature=0.8)
    tokens = _draw(logits_V, params, 20_000)
    freq_V = torch.bincount(tokens, minlength=5).float() / tokens.numel()
    expect_V = torch.softmax(logits_V / 0.8, dim=0)
    assert torch.allclose(freq_V, expect_V, atol=0.015), (freq_V, expect_V)


def test_truncations_and_greedy():
    logits_V = torch.tensor([3.0, 2.9, 2.8, -5.0, 0.0, 1.0])
    assert set(_draw(logits_V, SamplingParams(temperature=1.0, top_k=2), 500).tolist()) == {0, 1}
    assert set(_draw(logits_V, SamplingParams(temperature=1.0, top_p=0.3), 200).tolist()) == {0}
    assert 3 not in set(_draw(logits_V, SamplingParams(temperature=1.0, min_p=0.05), 500).tolist())
    assert set(_draw(logits_V, SamplingParams(temperature=0.0), 10).tolist()) == {0}


def test_mixed_rows_and_seeds_reproduce():
    logits_BV = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.2, top_p=0.9),
    ]

    def run():
        gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
        logprobs_BV = sampling_logprobs(logits_BV, torch.tensor([[0.0], [1.0], [1.2]]))
        return [sample_tokens(logprobs_BV, params, gens).tolist() for _ in range(4)]

    first = run()
    assert first == run() and all(row[0] == int(logits_BV[0].argmax()) for row in first)
    assert all(row[1] in torch.topk(logits_BV[1], 5).indices.tolist() for row in first)


def _kept_reference(logprobs_V: torch.Tensor, p: SamplingParams) -> set[int]:
    """The kept set after a full descending sort, in float64 (the rules in sampling.py)."""
    probs = logprobs_V.double().exp()
    V = probs.numel()
    order = torch.argsort(probs, descending=True, stable=True)
    keep = torch.ones(V, dtype=torch.bool)
    if 0 < p.top_k < V:
        keep[order[p.top_k :]] = False
    keep &= probs >= p.min_p * probs.max()
    kept = torch.where(keep, probs, 0.0)
    before = kept[order].cumsum(0) - kept[order]
    keep[order[before > p.top_p * kept.sum()]] = False
    return set(keep.nonzero().squeeze(1).tolist())


def test_candidate_search_keeps_exactly_what_a_full_sort_keeps():
    """Rows settle at K = 64, 1024 or the whole vocab; each must keep the same tokens as
    the float64 full-sort reference, including rows flat enough to need the whole vocab."""
    from spade_async.generation.sampling import truncated_candidates

    gen = torch.Generator().manual_seed(7)
    V = 5000
    scales = [8.0, 3.0, 1.0, 0.3, 0.01]  # peaked ... nearly flat
    params = [SamplingParams(temperature=1.0, top_p=0.95), SamplingParams(temperature=1.0, top_k=20),
              SamplingParams(temperature=1.0, min_p=0.1), SamplingParams(temperature=1.0, top_k=1500, top_p=0.9),
              SamplingParams(temperature=1.0, min_p=0.02, top_p=0.5)]  # fmt: skip
    rows, row_params = [], []
    for scale in scales:
        for p in params:
            rows.append(torch.log_softmax(torch.randn(V, generator=gen) * scale, 0))
            row_params.append(p)
    logprobs_RV = torch.stack(rows)
    groups = truncated_candidates(logprobs_RV, row_params)
    widths = set()
    seen = []
    for rows_G, ids_GK, probs_GK in groups:
        widths.add(ids_GK.shape[1])
        for g, r in enumerate(rows_G.tolist()):
            seen.append(r)
            kept = set(ids_GK[g][probs_GK[g] > 0].tolist())
            assert kept == _kept_reference(logprobs_RV[r], row_params[r]), (r, row_params[r])
            assert torch.equal(
                probs_GK[g][probs_GK[g] > 0], logprobs_RV[r].exp()[ids_GK[g][probs_GK[g] > 0]]
            )
    assert sorted(seen) == list(range(len(rows)))
    assert {64, V} <= widths, widths  # peaked rows stop early, flat rows fall back


def test_a_rows_draw_does_not_depend_on_its_batch():
    """Each row drawn alone equals the same row drawn in a batch of every kind (greedy,
    plain, truncated, other temperatures): the sampler's per-path row selection (no copy
    when a path takes every row) must put each draw back on its own row."""
    gen = torch.Generator().manual_seed(3)
    kinds = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_p=0.8),
             SamplingParams(temperature=1.0, top_k=4), SamplingParams(temperature=1.1, min_p=0.1)]  # fmt: skip
    for trial in range(30):
        B, V = 2 + trial % 7, 50 + 13 * trial
        logits_BV = torch.randn(B, V, generator=gen) * (1 + trial % 4)
        params = [kinds[int(i)] for i in torch.randint(0, len(kinds), (B,), generator=gen)]
        if trial % 3 == 0:  # one path takes every row
            params = [kinds[trial % len(kinds)]] * B
        temps_B1 = torch.tensor([[p.temperature] for p in params])
        logprobs_BV = sampling_logprobs(logits_BV, temps_B1)
        seeds = torch.randint(0, 2**31 - 1, (B,), generator=gen).tolist()
        batch = sample_tokens(logprobs_BV, params, [torch.Generator().manual_seed(s) for s in seeds])
        for b in range(B):
            alone = sample_tokens(
                logprobs_BV[b : b + 1], [params[b]], [torch.Generator().manual_seed(seeds[b])]
            )
            assert int(alone) == int(batch[b]), (trial, b, params[b])


def test_a_draw_that_rounds_up_to_the_total_takes_the_last_drawable_token():
    """``u * total`` can round up to the total; the search then runs off the end and the row
    must take its last token of positive probability (zeros after it can never be drawn),
    and otherwise the first token whose cumulative mass exceeds ``u * total``."""
    from spade_async.generation.sampling import _inverse_cdf

    gen = torch.Generator().manual_seed(5)
    for _ in range(500):
        N = int(torch.randint(2, 40, (1,), generator=gen))
        probs_RN = torch.rand(4, N, generator=gen)
        zeros = int(torch.randint(0, N, (1,), generator=gen))
        if zeros:
            probs_RN[:, N - zeros :] = 0
        if N - zeros > 1:  # a hole inside, leaving the first token drawable
            probs_RN[:, int(torch.randint(1, N - zeros, (1,), generator=gen))] = 0
        u_R = torch.tensor([1.0, 1.0 - 2**-24, float(torch.rand(1, generator=gen)), 0.0])
        drawn_R = _inverse_cdf(probs_RN, u_R)
        cdf_RN = probs_RN.cumsum(1)
        for r in range(4):
            positive = probs_RN[r].nonzero().squeeze(1)
            target = float(u_R[r].to(cdf_RN.dtype) * cdf_RN[r, -1])
            above = (cdf_RN[r] > target).nonzero().squeeze(1)
            expect = int(above[0]) if above.numel() else int(positive[-1])
            assert int(drawn_R[r]) == expect, (probs_RN[r], u_R[r])
            assert probs_RN[r, int(drawn_R[r])] > 0
