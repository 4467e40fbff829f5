"""Batch validation, NaN skipping, schedule."""

from __future__ import annotations

import math

import pytest
import torch

from spade_async.trainer.batch import Batch, BatchError, Sample, validate_batch
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.step import lr_lambda


def _ok(**kw) -> Sample:
    base = dict(token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], advantage=0.5,
                rollout_logprobs=[0.0, 0.0, -1.0, -2.0])
    base.update(kw)
    return Sample(**base)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (dict(loss_mask=[0, 1, 1]), "loss_mask has 3 entries but token_ids has 4"),
        (dict(rollout_logprobs=[0.0, -1.0]), "rollout_logprobs has 2 entries"),
        (dict(loss_mask=[0, 0, 0, 0]), "loss_mask is all zeros"),
        (dict(advantage=math.nan), "advantage is nan"),
        (dict(token_ids=[1, 2, 3, 99]), "token id 99 is outside the vocabulary [0, 50)"),
        (dict(token_ids=[1, -2, 3, 4]), "token id -2 is outside"),
        (dict(loss_mask=[1, 0, 1, 1]), "loss_mask[0] is 1"),
        (dict(rollout_logprobs=[0.0, 0.0, math.inf, -1.0]), "rollout_logprobs[2] = inf"),
    ],
)
def test_validation_names_sample_index_and_reason(bad, reason):
    batch = Batch(samples=[_ok(), _ok(), _ok(**bad)])
    with pytest.raises(BatchError) as e:
        validate_batch(batch, vocab_size=50)
    assert str(e.value).startswith("sample 2 (agent): ")
    assert reason in str(e.value)


def test_valid_batch_passes_and_empty_fails():
    validate_batch(Batch(samples=[_ok(), _ok()]), vocab_size=50)
    with pytest.raises(BatchError, match="no samples"):
        validate_batch(Batch(samples=[]), vocab_size=50)


def test_warmup_then_cosine():
    f = lr_lambda(TrainerConfig(warmup_steps=2, total_steps=10, min_lr_ratio=0.1))
    assert [round(f(s), 4) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert f(7) < 1.0 and math.isclose(f(12), 0.1) and math.isclose(f(50), 0.1)


def test_nan_loss_skips_step_and_keeps_weights(tiny_model):
    from spade_async.trainer.step import Trainer

    trainer = Trainer(TrainerConfig(model=str(tiny_model), lr=1e-2), tiny_model)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    good = Batch(samples=[_ok(), _ok(advantage=-0.5)])
    # A poisoned weight makes the loss NaN without an invalid batch.
    norm_w = trainer.model.causal_lm.model.norm.weight
    saved = norm_w.detach().clone()
    with torch.no_grad():
        norm_w[0] = math.nan
    m = trainer.train_step(good)
    assert m["skipped"] == 1.0 and m["skipped_steps"] == 1.0 and m["version"] == 0.0
    with torch.no_grad():
        norm_w.copy_(saved)  # the only change was ours: the step itself touched nothing
    after = [p.detach() for p in trainer.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert trainer.optimizer.state == {} or all(
        not s for s in trainer.optimizer.state.values()
    )
    m = trainer.train_step(good)
    assert m["skipped"] == 0.0 and m["version"] == 1.0 and math.isfinite(m["loss"])
    assert any(not torch.equal(a, b) for a, b in
               zip(trainer.model.parameters(), before, strict=True))


def test_activation_checkpointing_gives_same_gradients(tiny_model):
    from spade_async.trainer.step import Trainer

    batch = Batch(samples=[_ok(), _ok(advantage=-0.5, token_ids=[7, 8, 9, 10])])
    grads = []
    for ac in (False, True):
        cfg = TrainerConfig(model=str(tiny_model), activation_checkpointing=ac,
                            old_logprobs="rollout")
        trainer = Trainer(cfg, tiny_model)
        assert trainer.model.causal_lm.is_activation_checkpointing == ac
        trainer.accumulate(batch)
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()]))
    assert grads[0].abs().sum() > 0
    # the same fp32 arithmetic recomputed: within twice the rounding bound of either
    from numerics import assert_close_norm, reduction_bound

    assert_close_norm(grads[1], grads[0], 2 * reduction_bound(49152, 4), "checkpointed")


def test_loss_normaliser_counts_samples_that_train_nothing(tiny_model):
    """A sample-mean loss over 2 samples with ``loss_normaliser`` 8 is the 2-sample loss x 2/8:
    the 6 others (zero-mask compact-filtered ones) count in the denominator, as the
    reference's global-batch division. Token aggregation adds one token for each of them
    (slime's loss_function counts max(n, 1) loss tokens per sample): 4 tokens -> 10."""
    from spade_async.trainer.step import Trainer

    samples = [_ok(), _ok(advantage=-0.25, token_ids=[7, 8, 9, 10])]
    losses = {}
    for agg in ("seq-mean-token-mean", "token"):
        cfg = TrainerConfig(model=str(tiny_model), loss_agg=agg, old_logprobs="rollout")
        for n in (0.0, 8.0):
            trainer = Trainer(cfg, tiny_model)
            vec, _, _ = trainer.accumulate(Batch(samples=samples, loss_normaliser=n))
            losses[agg, n] = float(vec[0])
    assert losses["seq-mean-token-mean", 0.0] != 0.0
    # the same fp32 sum scaled by 2/8: a few roundings of the loss's own magnitude
    assert losses["seq-mean-token-mean", 8.0] == pytest.approx(
        losses["seq-mean-token-mean", 0.0] * 2 / 8, rel=1e-6
    )
    assert losses["token", 8.0] == pytest.approx(losses["token", 0.0] * 4 / 10, rel=1e-6)
    with pytest.raises(BatchError, match="loss_normaliser 1.0 is below the batch's 2 samples"):
        validate_batch(Batch(samples=samples, loss_normaliser=1.0), vocab_size=50)
