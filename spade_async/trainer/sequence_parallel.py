"""Ulysses sequence parallelism (``trainer.sequence_parallel = N``), as verl and DeepSpeed do.

Legend: T tokens of a packed row, t = T / N per rank, H attention heads, d head size, K loss
tokens of a rank's slice.

N consecutive ranks form a group that trains the same packed row; each holds t of its
tokens (``shard``: the row padded to a multiple of N by a dummy trailing segment, then cut
into N slices) and runs every token-wise layer (embedding, norms, MLP, the fused log-prob
head, the loss) on its slice only. Attention needs the whole row: an all-to-all turns the
local [t, H] query/key/value into [T, H / N] (every token, a slice of the heads), the
configured attention (varlen SDPA or flash-attn, with the row's global ``cu_seqlens``) runs
on it, and a second all-to-all returns [t, H]. Both all-to-alls are differentiable (the
backward of an equal-split all-to-all is the same all-to-all on the gradients).

The loss is a sum over tokens divided by the batch's global denominator, so the group's
partial losses add up to the one-rank loss and FSDP's gradient average over all ranks is
unchanged. ``seq-mean-token-mean`` (a per-sample mean over tokens that a slice does not
see whole) takes its per-token weights mask / (n_s x D) from the whole row before slicing
(``token_slice``), so it needs the fused head, whose loss is exactly sum_t w_t loss_t.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from spade_async.errors import ConfigError

__all__ = ["setup", "shard", "seq_to_heads", "heads_to_seq", "NAME"]

NAME = "spade_ulysses"


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """[B, H, t, d] (this rank's tokens, every head) -> [B, H / n, n t, d] (every token)."""
    B, H, t, d = x.shape
    chunks = x.reshape(B, n, H // n, t, d).transpose(0, 1).contiguous()  # head chunk j -> rank j
    got = _AllToAll.apply(chunks.reshape(n, -1), group).reshape(n, B, H // n, t, d)
    return got.permute(1, 2, 0, 3, 4).reshape(B, H // n, n * t, d)  # rank j's tokens at j


def heads_to_seq(o: torch.Tensor, group, n: int) -> torch.Tensor:
    """[B, T, H / n, d] (attention output, every token) -> [B, T / n, H, d] (this rank's)."""
    B, T, h, d = o.shape
    t = T // n
    chunks = o.reshape(B, n, t, h, d).transpose(0, 1).contiguous()  # token slice j -> rank j
    got = _AllToAll.apply(chunks.reshape(n, -1), group).reshape(n, B, t, h, d)
    return got.permute(1, 2, 0, 3, 4).reshape(B, t, n * h, d)  # head chunk j from rank j


def setup(policy, n: int, rank: int, world: int):
    """Route ``policy``'s attention through the all-to-alls; returns this rank's SP group.
    Every rank calls this (new_group is collective)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = policy.causal_lm.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or 0
    if world % n or heads % n or (kv and kv % n):
        raise ConfigError(
            f"trainer.sequence_parallel = {n} must divide the {world} ranks, the {heads} "
            f"attention heads and the {kv} KV heads"
        )
    group = None
    for g in range(world // n):  # every rank creates every group, in the same order
        ranks = list(range(g * n, (g + 1) * n))
        pg = dist.new_group(ranks)
        if rank in ranks:
            group = pg
    inner = ALL_ATTENTION_FUNCTIONS[cfg._attn_implementation]

    def ulysses(module, query, key, value, attention_mask, **kwargs):
        q, k, v = (seq_to_heads(x, group, n) for x in (query, key, value))
        out, weights = inner(module, q, k, v, None, **kwargs)
        return heads_to_seq(out, group, n), weights

    AttentionInterface.register(NAME, ulysses)
    cfg._attn_implementation = NAME
    policy.varlen_attention = True
    return group


def token_slice(x_T: torch.Tensor, sp_rank: int, n: int) -> torch.Tensor:
    """This rank's 1/n of a per-token tensor of a whole packed row, padded (with zeros, the
    dummy segment trains nothing) exactly as ``shard`` pads the row."""
    pad = (-x_T.shape[-1]) % n
    if pad:
        x_T = torch.cat([x_T, x_T.new_zeros((*x_T.shape[:-1], pad))], dim=-1)
    t = x_T.shape[-1] // n
    return x_T[..., sp_rank * t : (sp_rank + 1) * t]


def shard(mb, sp_rank: int, n: int):
    """This rank's 1/n of a packed micro-batch; the row is padded to a multiple of n with a
    dummy trailing segment (position 0.., no loss), ``cu_seqlens`` stays the whole row's."""
    if mb.cu_seqlens is None:
        raise ValueError("sequence parallel needs packed micro-batches (trainer.packing)")
    T = mb.input_ids.shape[1]
    pad = (-T) % n
    cu = mb.cu_seqlens
    fields = {}
    if pad:
        cu = torch.cat([cu, cu.new_tensor([T + pad])])

        def grow(x, fill=0):
            return torch.cat([x, x.new_full((*x.shape[:-1], pad), fill)], dim=-1)

        fields = dict(
            input_ids=grow(mb.input_ids),
            position_ids=torch.cat(
                [mb.position_ids, torch.arange(pad, dtype=mb.position_ids.dtype)[None]], dim=1
            ),
            target_T=grow(mb.target_T),
            mask_T=grow(mb.mask_T),
            advantage_T=grow(mb.advantage_T),
            rollout_logprob_T=grow(mb.rollout_logprob_T),
            seq_T=grow(mb.seq_T, -1),
            local_seq_T=grow(mb.local_seq_T),
        )
    full = dataclasses.replace(mb, **fields) if fields else mb
    t = (T + pad) // n
    a, b = sp_rank * t, (sp_rank + 1) * t
    K = torch.nonzero(full.mask_T[a:b] > 0).flatten()
    return dataclasses.replace(
        full,
        input_ids=full.input_ids[:, a:b],
        position_ids=full.position_ids[:, a:b],
        target_T=full.target_T[a:b],
        mask_T=full.mask_T[a:b],
        advantage_T=full.advantage_T[a:b],
        rollout_logprob_T=full.rollout_logprob_T[a:b],
        seq_T=full.seq_T[a:b],
        local_seq_T=full.local_seq_T[a:b],
        loss_index_K=K if K.numel() else torch.zeros(1, dtype=torch.long),
        cu_seqlens=cu,
        max_seqlen=max(mb.max_seqlen, pad),
        n_tokens=int(((full.seq_T[a:b]) >= 0).sum()),
    )
