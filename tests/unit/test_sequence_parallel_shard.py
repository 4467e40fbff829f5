"""sequence_parallel.shard: each rank's slice of a packed row (one process, no collectives)."""

from __future__ import annotations

import torch

from spade_async.trainer.batch import Sample
from spade_async.trainer.packing import build_microbatch
from spade_async.trainer.sequence_parallel import shard


def test_slices_cover_the_row_once_and_keep_the_global_boundaries():
    samples = [
        Sample(
            token_ids=list(range(1, 8)),
            loss_mask=[0, 0, 1, 1, 1, 1, 1],
            advantage=1.0,
            rollout_logprobs=[0.0] * 7,
        ),
        Sample(
            token_ids=list(range(10, 14)),
            loss_mask=[0, 1, 1, 1],
            advantage=-1.0,
            rollout_logprobs=[0.0] * 4,
        ),
    ]
    mb = build_microbatch(samples, [0, 1], packed=True)
    T = mb.input_ids.shape[1]
    assert T == 11
    parts = [shard(mb, r, 3) for r in range(3)]  # 11 -> padded to 12, 4 tokens each
    assert [p.input_ids.shape[1] for p in parts] == [4, 4, 4]
    ids = torch.cat([p.input_ids for p in parts], dim=1)[0]
    assert ids[:T].tolist() == mb.input_ids[0].tolist() and ids[T:].tolist() == [0]
    pos = torch.cat([p.position_ids for p in parts], dim=1)[0]
    assert pos[:T].tolist() == mb.position_ids[0].tolist() and pos[T:].tolist() == [0]
    for p in parts:  # every rank attends with the whole (padded) row's boundaries
        assert p.cu_seqlens.tolist() == mb.cu_seqlens.tolist() + [12]
    mask = torch.cat([p.mask_T for p in parts])
    assert mask[:T].tolist() == mb.mask_T.tolist() and mask[T:].sum() == 0
    assert sum(p.n_tokens for p in parts) == mb.n_tokens == 11
    for p in parts:  # loss positions are local indices of trained tokens
        assert torch.all(p.mask_T[p.loss_index_K] > 0) or p.mask_T.sum() == 0
    assert shard(mb, 0, 1).input_ids.shape == mb.input_ids.shape
