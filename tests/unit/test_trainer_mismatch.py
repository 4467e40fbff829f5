"""The train/inference mismatch metrics of a train step, against a float64 reference."""

from __future__ import annotations

import math

import torch

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig


def _reference_logprobs(trainer, token_ids: list[int]) -> list[float]:
    """log p(token_t | tokens_<t) from a plain float64 forward of the same weights."""
    lm = trainer.model.causal_lm
    import copy

    ref = copy.deepcopy(lm).to(torch.float64)
    with torch.no_grad():
        logits = ref(torch.tensor([token_ids])).logits[0]
    logp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [float(logp[t - 1, token_ids[t]]) for t in range(1, len(token_ids))]


def test_mismatch_kl_and_max_match_the_definition(tiny_model):
    from spade_async.trainer.step import Trainer

    trainer = Trainer(
        TrainerConfig(model=str(tiny_model), lr=1e-3, micro_batch_tokens=8), tiny_model
    )
    ids = [[5, 17, 301, 4000, 12, 9], [7, 8, 9, 10, 11, 12]]
    offsets = [[0.0, 0.0, 0.0, 0.3, -0.5, 0.1], [0.0, 0.0, 0.0, 0.0, 1.25, -0.2]]
    samples = []
    for tok, off in zip(ids, offsets, strict=True):
        ref = _reference_logprobs(trainer, tok)
        mask = [0, 0, 0, 1, 1, 1] if tok is ids[0] else [0, 0, 0, 0, 1, 1]
        roll = [r + o if m else 0.0 for r, o, m in zip(ref, off, mask, strict=True)]
        samples.append(Sample(token_ids=tok, loss_mask=mask, advantage=1.0, rollout_logprobs=roll))
    m = trainer.train_step(Batch(samples=samples))
    d = [
        o
        for off, s in zip(offsets, samples, strict=True)
        for o, k in zip(off, s.loss_mask, strict=True)
        if k
    ]
    want_kl = sum(math.expm1(-x) + x for x in d) / len(d)
    # float32 log-probs of a 49k vocabulary: ~1e-5 absolute; dk3/dd = 1 - exp(-d) <= 2.5 here
    assert math.isclose(m["mismatch_kl"], want_kl, abs_tol=1e-4), (m["mismatch_kl"], want_kl)
    assert math.isclose(m["mismatch_max"], 1.25, abs_tol=1e-4), m["mismatch_max"]
    assert math.isclose(m["logprob_gap"], sum(map(abs, d)) / len(d), abs_tol=1e-4)
    assert m["mismatch_kl"] > 0.05  # not a zero that would pass any tolerance
    w = [math.exp(-x) for x in d]
    assert math.isclose(m["is_weight_mean"], sum(w) / len(w), rel_tol=1e-4)
    assert math.isclose(m["is_weight_sq"], sum(x * x for x in w) / len(w), rel_tol=1e-4)
