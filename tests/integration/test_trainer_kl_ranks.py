"""KL to the frozen initial policy with the reference model sharded over two gloo ranks."""

from __future__ import annotations

import math

import pytest

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess


def _batch(n: int = 6) -> Batch:
    return Batch(
        samples=[
            Sample(
                token_ids=[1 + i, 20 + i, 300 + i, 4000 + i, 50 + i],
                loss_mask=[0, 0, 1, 1, 1],
                advantage=1.0 if i % 2 else -1.0,
                rollout_logprobs=[0.0, 0.0, -10.8, -10.8, -10.8],
                role="agent",
            )
            for i in range(n)
        ]
    )


@pytest.mark.slow  # ~27 s on 2 cores: two torchrun'd ranks, two model copies each
def test_two_ranks_kl_to_the_initial_policy(tiny_model, tmp_path):
    cfg = TrainerConfig(
        model=str(tiny_model), lr=1e-2, kl_coef=0.1, micro_batch_tokens=12, start_timeout_s=120
    )
    proc = TrainerProcess(cfg, tiny_model, tmp_path / "run", nproc=2)
    client = proc.start()
    try:
        first = client.train_step(_batch())
        # the policy is still the initial one: its KL to the frozen copy is exactly 0 (the
        # rollout log-probs, -10.8, are far from the model's: 'rollout' would not be 0)
        assert first["kl"] == 0.0
        second = client.train_step(_batch())
        assert second["kl"] > 0.0 and math.isfinite(second["kl"])
        assert second["version"] == 2.0
    finally:
        proc.kill()
