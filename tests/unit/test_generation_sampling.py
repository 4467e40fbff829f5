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
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=1.2, top_p=0.9)]

    def run():
        gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
        logprobs_BV = sampling_logprobs(logits_BV, torch.tensor([[0.0], [1.0], [1.2]]))
        return [sample_tokens(logprobs_BV, params, gens).tolist() for _ in range(4)]

    first = run()
    assert first == run() and all(row[0] == int(logits_BV[0].argmax()) for row in first)
    assert all(row[1] in torch.topk(logits_BV[1], 5).indices.tolist() for row in first)
