"""Sequence packing and token-budget micro-batches, balanced across ranks.

Legend: T tokens in one micro-batch (packed: one row of concatenated samples; padded:
B rows of L, flattened to T = B * L), N samples in the whole batch, R ranks, K loss tokens
of a micro-batch.

Packed rows restart ``position_ids`` at 0 for every sample. transformers turns that into a
block-diagonal causal mask for sdpa/eager on CPU and into varlen flash-attention
(cu_seqlens) with ``flash_attention_2`` on GPU, so attention never crosses samples.
Position t predicts token t + 1 of the same sample; the last position of each sample gets
target 0 with weight 0, so the loss never crosses samples either.

The loss normaliser is global (``loss_denominator``: loss tokens, or samples, of the whole
batch), so the loss is the same however the batch is split into micro-batches and ranks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from spade_async.trainer.batch import Sample, loss_units

__all__ = [
    "LAYOUTS",
    "MicroBatch",
    "plan_microbatches",
    "build_microbatch",
    "loss_denominator",
    "unit_tokens",
]

# packed: one row per micro-batch; padded: rows padded to the micro-batch's longest (dynamic
# padding, as OpenRLHF/TRL collate); padded_max: every row padded to the batch's longest
# (one static shape, as verl without remove_padding). Only "packed" and "padded" are config
# choices; "padded_max" exists as the benchmark's conventional baseline.
LAYOUTS = ("packed", "padded", "padded_max", "padded_sorted")


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [1, T] packed or [B, L] padded (long)
    position_ids: torch.Tensor  # same shape (long)
    attention_mask: torch.Tensor | None  # [B, L] padding mask (padded only), None when packed
    target_T: torch.Tensor  # next token of the same sample (long), 0 where unused
    mask_T: torch.Tensor  # 1.0 where the target is a trained token
    advantage_T: torch.Tensor  # the sample's advantage on every position (fp32)
    rollout_logprob_T: torch.Tensor  # engine log-prob of the target (fp32), 0 where unused
    seq_T: torch.Tensor  # global sample index of each position, -1 on padding (long)
    local_seq_T: torch.Tensor  # sample index within this micro-batch, 0 on padding (long)
    loss_index_K: torch.Tensor  # positions with a loss token (at least one: [0] if none)
    cu_seqlens: torch.Tensor | None  # packed: int32 sequence boundaries [S + 1]; None padded
    max_seqlen: int  # longest sequence in the micro-batch
    n_tokens: int  # real (non-padding) tokens

    def to(self, device: torch.device) -> MicroBatch:
        moved = {
            k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in self.__dict__.items()
        }
        return MicroBatch(**moved)


def loss_denominator(samples: list[Sample], agg: str, normaliser: float = 0.0) -> float:
    """Global normaliser: the batch's loss tokens (token agg) or its unit count (samples; an
    episode's loss_group once), or ``normaliser`` (``Batch.loss_normaliser``) when set. For
    token agg each unit ``normaliser`` counts beyond the batch's adds one token: slime counts
    max(n, 1) loss tokens per sample (``loss_function``'s num_tokens), so a zero-mask
    sample the batch does not carry still adds one."""
    units = len(set(loss_units(samples)))
    if agg == "token":
        extra = max(0.0, normaliser - units) if normaliser else 0.0
        return float(sum(sum(s.loss_mask) for s in samples)) + extra
    return float(normaliser or units)


def unit_tokens(samples: list[Sample]) -> list[int]:
    """Per sample, the loss tokens of its unit (the whole loss_group's): n_s of a
    seq-mean-token-mean over units (slime's group_mask_sums)."""
    units = loss_units(samples)
    count = [0] * len(samples)
    for u, s in zip(units, samples, strict=True):
        count[u] += sum(s.loss_mask)
    return [count[u] for u in units]


def _ffd(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing bins of total length <= budget (an oversized sample sits alone)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda j: -lengths[j]):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def _padded_bins(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Arrival-order micro-batches of a fixed sample count k = budget // longest (>= 1).

    This is what a padded trainer must do to bound memory for the worst case; each
    micro-batch is then padded to its own longest sample (dynamic padding).
    """
    if not indices:
        return []
    k = max(1, budget // max(lengths[i] for i in indices))
    return [indices[j : j + k] for j in range(0, len(indices), k)]


def _sorted_bins(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Length-sorted bucketing: shortest first, each micro-batch as many samples as keep
    count x its longest <= budget (>= 1), each padded to its own longest."""
    bins: list[list[int]] = []
    for i in sorted(indices, key=lambda j: lengths[j]):
        if bins and (len(bins[-1]) + 1) * lengths[i] <= budget:
            bins[-1].append(i)  # ascending: i is the new longest of this bin
        else:
            bins.append([i])
    return bins


def plan_microbatches(
    lengths: list[int],
    world_size: int,
    budget: int,
    *,
    packed: bool = True,
    sorted_buckets: bool = False,
) -> list[list[list[int]]]:
    """plan[rank] = micro-batches (lists of sample indices); every rank gets the same count.

    Samples go to ranks longest first onto the least-loaded rank (balanced tokens); each
    rank then packs first-fit decreasing under the token budget (packed) or takes them in
    order, a fixed count per micro-batch, each padded to its longest (padded), or in length
    order as many as fit the budget padded (``sorted_buckets``). A rank short of micro-batches splits its largest
    one, or gets an empty one (it still runs forward/backward so FSDP collectives match).
    """
    load = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        r = min(range(world_size), key=lambda k: load[k])
        owned[r].append(i)
        load[r] += lengths[i]
    if packed:
        plan = [_ffd(o, lengths, budget) for o in owned]
    else:
        bins = _sorted_bins if sorted_buckets else lambda o, n, b: _padded_bins(sorted(o), n, b)
        plan = [bins(o, lengths, budget) for o in owned]
    n = max(len(p) for p in plan)
    for p in plan:
        while len(p) < n:
            big = max(range(len(p)), key=lambda b: len(p[b])) if p else -1
            if big >= 0 and len(p[big]) > 1:
                half = len(p[big]) // 2
                p.append(p[big][half:])
                p[big] = p[big][:half]
            else:
                p.append([])
    return plan


def build_microbatch(
    samples: list[Sample], indices: list[int], *, packed: bool = True, pad_to: int = 0
) -> MicroBatch:
    """Tensors for one micro-batch (CPU); ``indices`` may be empty (a 2-token dummy, mask 0).

    ``pad_to`` (padded only) widens every row to at least that many positions.
    """
    if not indices:
        z = torch.zeros(1, 2, dtype=torch.long)
        f = torch.zeros(2)
        return MicroBatch(
            z,
            torch.arange(2).unsqueeze(0),
            None,
            z[0],
            f,
            f,
            f,
            torch.full((2,), -1),
            z[0],
            torch.zeros(1, dtype=torch.long),
            0,
        )
    seqs = [samples[i] for i in indices]
    rows = [len(s.token_ids) for s in seqs]
    width = sum(rows) if packed else max(*rows, pad_to)
    n_rows = 1 if packed else len(seqs)
    ids = torch.zeros(n_rows, width, dtype=torch.long)
    pos = torch.zeros(n_rows, width, dtype=torch.long)
    tgt = torch.zeros(n_rows, width, dtype=torch.long)
    loc = torch.zeros(n_rows, width, dtype=torch.long)
    msk = torch.zeros(n_rows, width)
    adv = torch.zeros(n_rows, width)
    rlp = torch.zeros(n_rows, width)
    seq = torch.full((n_rows, width), -1, dtype=torch.long)
    att = None if packed else torch.zeros(n_rows, width, dtype=torch.long)
    offset = 0
    for k, (i, s) in enumerate(zip(indices, seqs, strict=True)):
        n = len(s.token_ids)
        r, a = (0, offset) if packed else (k, 0)
        b = a + n
        ids[r, a:b] = torch.tensor(s.token_ids)
        pos[r, a:b] = torch.arange(n)
        m = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        tgt[r, a : b - 1] = ids[r, a + 1 : b]
        msk[r, a : b - 1] = m
        adv[r, a:b] = s.advantage
        rlp[r, a : b - 1] = torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32) * m
        seq[r, a:b] = i
        loc[r, a:b] = k
        if att is not None:
            att[r, a:b] = 1
        offset = b if packed else 0
    flat = {
        "target_T": tgt,
        "mask_T": msk,
        "advantage_T": adv,
        "rollout_logprob_T": rlp,
        "seq_T": seq,
        "local_seq_T": loc,
    }
    index_K = msk.reshape(-1).nonzero().squeeze(1)
    if index_K.numel() == 0:  # keep one position so backward still reaches every layer
        index_K = torch.zeros(1, dtype=torch.long)
    return MicroBatch(
        ids,
        pos,
        att,
        n_tokens=sum(rows),
        loss_index_K=index_K,
        cu_seqlens=torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int32)
        if packed
        else None,
        max_seqlen=max(rows),
        **{k: v.reshape(-1) for k, v in flat.items()},
    )
