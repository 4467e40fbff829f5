"""trainer.head = "fused" (one pass: loss + gradient) against "recompute" (log-probs, then
policy_loss through autograd) on the tiny model: same loss, metrics and gradients.

Both are float32 evaluations of one function of the same weights; each is within the
rounding bound of the float64 value (the fp32 sums over the vocabulary, hidden size and
tokens, plus the loss's few pointwise ops: tests/numerics.py), so they differ by at most
twice that bound.
"""

from __future__ import annotations

import msgspec
import pytest
import torch
from numerics import assert_close_norm, pointwise_bound, reduction_bound

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig


def _batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, n in enumerate((9, 6, 12)):
        ids = torch.randint(0, 49152, (n,), generator=g).tolist()
        mask = [0] * 3 + [1] * (n - 3)
        # near log(1/V) of the random model: ratios, TIS weights and k3 all moderate
        lps = [0.0] * 3 + (-10.8 + 0.3 * torch.randn(n - 3, generator=g)).tolist()
        samples.append(
            Sample(token_ids=ids, loss_mask=mask, advantage=(-1.0) ** i, rollout_logprobs=lps)
        )
    return Batch(samples=samples)


CASES = {
    "default": {},
    "rollout_old_seq_mean": dict(old_logprobs="rollout", loss_agg="seq-mean-token-mean"),
    "kl_rollout_entropy_seq_sum": dict(
        kl_coef=0.1, kl_reference="rollout", entropy_coef=1.0, loss_agg="seq-mean-token-sum"
    ),
    "no_tis_temperature": dict(tis_cap=0.0, temperature=0.7, entropy_coef=0.02),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_head_equals_recompute_in_the_trainer(tiny_model, case):
    from spade_async.trainer.step import Trainer

    batch = _batch()
    out = {}
    for head in ("recompute", "fused"):
        cfg = TrainerConfig(model=str(tiny_model), head=head, **CASES[case])
        trainer = Trainer(cfg, tiny_model)
        vec, keys, _ = trainer.accumulate(batch)
        grads = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
        out[head] = (vec, keys, grads)
    (v_r, k_r, g_r), (v_f, k_f, g_f) = out["recompute"], out["fused"]
    assert k_r == k_f and g_r.abs().sum() > 0
    T = sum(len(s.token_ids) for s in batch.samples)
    rel = 2 * (reduction_bound(49152, 64, T) + pointwise_bound(12, 12.0))
    assert_close_norm(g_f, g_r.double(), rel, "fused vs recompute gradients")
    assert_close_norm(v_f, v_r.double(), rel, "loss and metrics")


def test_head_and_checkpointing_config_values():
    assert TrainerConfig().head == "fused"
    dec = msgspec.json.decode
    for raw, mode in ((True, "full"), (False, "none"), ("selective", "selective")):
        cfg = dec(msgspec.json.encode({"activation_checkpointing": raw}), type=TrainerConfig)
        from spade_async.trainer.checkpointing import mode_of

        assert mode_of(cfg.activation_checkpointing) == mode
    with pytest.raises(msgspec.ValidationError):
        dec(b'{"head": "naive"}', type=TrainerConfig)
    with pytest.raises(msgspec.ValidationError):
        dec(b'{"activation_checkpointing": "some"}', type=TrainerConfig)
