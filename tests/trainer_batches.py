"""A small deterministic trainer batch shared by the checkpoint, offload and LoRA tests."""

from __future__ import annotations

import torch

from spade_async.trainer.batch import Batch, Sample


def random_batch(step: int, vocab: int = 49152) -> Batch:
    """Four samples of 6, 9, 12, 15 tokens (3 prompt tokens each), advantages -1.5..1.5, and
    rollout log-probs far from the policy's (so the TIS cap and the ratio clip both act)."""
    g = torch.Generator().manual_seed(step)
    samples = []
    for i in range(4):
        n = 6 + 3 * i
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * 3 + [1] * (n - 3)
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=mask,
                advantage=float(i) - 1.5,
                rollout_logprobs=[-10.5 * m for m in mask],
            )
        )
    return Batch(samples=samples)
