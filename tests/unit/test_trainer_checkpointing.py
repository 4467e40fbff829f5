"""trainer.activation_checkpointing: full / selective / none give the same gradients, and
selective recomputes no matrix product in backward (full recomputes every block's)."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_close_norm, reduction_bound
from torch.utils._python_dispatch import TorchDispatchMode

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig

GEMMS = ("mm", "addmm", "bmm", "baddbmm")


class CountGemms(TorchDispatchMode):
    """Counts matrix products that really run (a profiler would also count the ones that
    selective checkpointing answers from its cache: it records before dispatch)."""

    def __init__(self):
        super().__init__()
        self.ops = {getattr(torch.ops.aten, n).default for n in GEMMS}
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in self.ops
        return func(*args, **(kwargs or {}))


def _batch() -> Batch:
    return Batch(
        samples=[
            Sample(
                token_ids=[1, 2, 3, 4, 5, 6],
                loss_mask=[0, 0, 1, 1, 1, 1],
                advantage=0.5,
                rollout_logprobs=[0.0, 0.0, -10.0, -11.0, -10.5, -10.9],
            ),
            Sample(
                token_ids=[7, 8, 9, 10],
                loss_mask=[0, 1, 1, 1],
                advantage=-1.0,
                rollout_logprobs=[0.0, -10.2, -11.1, -10.7],
            ),
        ]
    )


def _run(tiny_model, mode):
    from spade_async.trainer.step import Trainer

    cfg = TrainerConfig(
        model=str(tiny_model), activation_checkpointing=mode, old_logprobs="rollout"
    )
    trainer = Trainer(cfg, tiny_model)
    with CountGemms() as counter:
        trainer.accumulate(_batch())
    gemms = counter.n
    grads = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
    return trainer, grads, gemms


def test_modes_give_same_gradients_and_selective_recomputes_no_gemm(tiny_model):
    base, g_none, n_none = _run(tiny_model, "none")
    assert not base.model.causal_lm.is_activation_checkpointing
    _, g_full, n_full = _run(tiny_model, "full")
    sel, g_sel, n_sel = _run(tiny_model, "selective")
    assert sel.model.causal_lm.is_activation_checkpointing
    assert g_none.abs().sum() > 0
    # the same fp32 arithmetic recomputed: within twice the rounding bound of either
    bound = 2 * reduction_bound(49152, 4)
    assert_close_norm(g_full, g_none.double(), bound, "full checkpointing")
    assert_close_norm(g_sel, g_none.double(), bound, "selective checkpointing")
    assert n_full > n_none  # full reruns each block's forward GEMMs in backward
    assert n_sel == n_none, (n_sel, n_none)


def test_bool_values_still_mean_full_and_none(tiny_model):
    from spade_async.trainer.checkpointing import mode_of

    assert mode_of(True) == "full" and mode_of(False) == "none"
    with pytest.raises(ValueError, match="activation_checkpointing"):
        mode_of("partial")
