"""Rollout routing replay (R3) in the trainer's MoE blocks, and the route mismatch it removes.

A bf16 engine and an fp32 trainer route some tokens to different experts; the importance
ratio then compares two networks. With ``trainer.routing_replay`` every MoE layer takes the
experts the engine recorded for each token (``Sample.routed_experts``) and weighs them with
the trainer's *own* router: softmax over all experts in fp32, gathered at the recorded ids,
renormalised when the model does (``norm_topk_prob``). That is slime's rule:
``slime/utils/routing_replay.py`` (``replay_forward``: ``probs = scores.gather(1,
top_indices)``, scores being the router's softmax), so the gradient still reaches the router
through those weights. Tokens without a recorded route (a sample without routes, padding,
a template's trailing tokens) route freely.

How: a forward hook on every router (transformers' ``*TopKRouter``, output ``(logits,
scores, indices)``) swaps in the recorded indices and the re-gathered weights; the experts
(grouped or looped) consume them unchanged. Each micro-batch's routes are looked up by
(sample, position) from ``seq_T`` and ``position_ids``, so packing, padding, micro-batches
and a sequence-parallel slice (its own tokens only) all get the rows of their tokens. The
KL reference (a frozen copy, or the same model with LoRA adapters off) is attached to the
same ``Replay`` and replays the same routes in its forward, as slime's reference pass does.
A re-forward under activation checkpointing replays the same rows again.

Counters stay on the device (no host sync): ``route_mismatch`` counts token x layer routes
whose experts (as a set) differ from the engine's among those the policy forward *used*
(0 with replay), ``route_drift`` those the trainer's own router would pick differently
(with replay on the inputs the replayed earlier layers gave it). Only the policy's forward counts (the reference's runs without
grad; a checkpoint re-forward comes after the last layer's hook).

Legend: T tokens of a micro-batch (as the router sees them, flattened), L MoE layers, K
top-k, N samples, R route rows of one sample.
"""

from __future__ import annotations

import numpy as np
import torch

from spade_async.generation.route_capture import routers
from spade_async.generation.routed_experts import RouteShape, route_shape

__all__ = ["Replay", "setup"]


class Replay:
    """The routes of the step in flight and the hooks that use them."""

    def __init__(self, shape: RouteShape, *, replay: bool, device: torch.device) -> None:
        self.shape, self.replay, self.device = shape, replay, device
        self._all_RLK = torch.zeros((1, shape.layers, shape.topk), dtype=torch.long)
        self._offset_N = torch.zeros(1, dtype=torch.long)
        self._rows_N = torch.zeros(1, dtype=torch.long)
        self.ids_TLK: torch.Tensor | None = None  # the micro-batch in flight
        self.has_T: torch.Tensor | None = None
        self.counting = False
        self.missing = self.bad = 0  # samples of the step trained without replay
        self.reset()

    def attach(self, causal_lm) -> None:
        found = routers(causal_lm)
        if len(found) != self.shape.layers:
            raise ValueError(f"{len(found)} MoE routers for {self.shape.layers} layers")
        for layer, module in enumerate(found):
            module.register_forward_hook(self._hook(layer, module))

    def reset(self) -> None:
        z = torch.zeros((), dtype=torch.long, device=self.device)
        self.mismatch, self.drift, self.total = z.clone(), z.clone(), z.clone()
        self.per_micro: list[torch.Tensor] = []  # mismatch share of each micro-batch (bench)

    # ---- host side: once per step, then once per micro-batch ------------------------------
    def prepare(self, samples) -> None:
        """Decode every sample's routes once; one without (or with a misfit) routes freely."""
        chunks, offsets, rows = [], [], []
        off = self.missing = self.bad = 0
        for s in samples:
            data, r = s.routed_experts, 0
            if not data:
                self.missing += 1
            elif len(data) % self.shape.row_bytes:
                self.bad += 1
            else:
                ids = np.frombuffer(data, dtype=self.shape.dtype).reshape(
                    -1, self.shape.layers, self.shape.topk
                )[: len(s.token_ids)]
                if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < self.shape.experts:
                    self.bad += 1
                else:
                    chunks.append(torch.from_numpy(ids.copy()))  # compact until a micro-batch
                    r = len(ids)
            offsets.append(off)
            rows.append(r)
            off += r
        dtype = torch.uint8 if self.shape.dtype.itemsize == 1 else torch.int16
        empty = torch.zeros((1, self.shape.layers, self.shape.topk), dtype=dtype)
        self._all_RLK = torch.cat([*chunks, empty]) if chunks else empty
        self._offset_N = torch.tensor(offsets or [0], dtype=torch.long)
        self._rows_N = torch.tensor(rows or [0], dtype=torch.long)

    def set_microbatch(self, mb) -> None:
        """The recorded routes of ``mb``'s tokens (by sample and position; host tensors)."""
        if not int(self._rows_N.sum()):  # no sample of the step has routes: nothing to do
            self.clear()
            return
        seq_T = mb.seq_T.reshape(-1)
        pos_T = mb.position_ids.reshape(-1)
        s_T = seq_T.clamp(min=0)
        has_T = (seq_T >= 0) & (pos_T < self._rows_N[s_T])
        index_T = torch.where(has_T, self._offset_N[s_T] + pos_T, 0)
        self.ids_TLK = self._all_RLK[index_T].long().to(self.device, non_blocking=True)
        self.has_T = has_T.to(self.device, non_blocking=True)
        self.counting = True

    def clear(self) -> None:
        self.ids_TLK = self.has_T = None
        self.counting = False

    # ---- device side: inside the forward ---------------------------------------------------
    def _hook(self, layer: int, module):
        last = layer == self.shape.layers - 1

        def swap(_module, _args, output):
            ids_TLK, has_T = self.ids_TLK, self.has_T
            logits_TE, _, own_TK = output
            if ids_TLK is None or ids_TLK.shape[0] != own_TK.shape[0]:
                return None
            rec_TK = ids_TLK[:, layer].to(own_TK.dtype)
            if self.replay:
                used_TK = torch.where(has_T[:, None], rec_TK, own_TK)
                probs_TE = torch.softmax(logits_TE, dim=-1, dtype=torch.float32)
                w_TK = probs_TE.gather(1, used_TK)
                if getattr(module, "norm_topk_prob", False):
                    w_TK = w_TK / w_TK.sum(dim=-1, keepdim=True)
                result = (logits_TE, w_TK.to(logits_TE.dtype), used_TK)
            else:
                used_TK, result = own_TK, None
            if self.counting and torch.is_grad_enabled():
                self._count(rec_TK, own_TK, used_TK, has_T, first=layer == 0)
                if last:
                    self.counting = False  # a checkpoint re-forward does not count again
            return result

        return swap

    def _count(self, rec_TK, own_TK, used_TK, has_T, *, first: bool) -> None:
        with torch.no_grad():
            rec = rec_TK.sort(dim=-1).values
            differ_T = (used_TK.sort(dim=-1).values != rec).any(dim=-1) & has_T
            drift_T = (own_TK.sort(dim=-1).values != rec).any(dim=-1) & has_T
            n = has_T.sum()
            self.mismatch += differ_T.sum()
            self.drift += drift_T.sum()
            self.total += n
            share = differ_T.sum() / n.clamp(min=1)
            if first:
                self.per_micro.append(share)
            else:
                self.per_micro[-1] = torch.maximum(self.per_micro[-1], share)

    def step_values(self) -> list[torch.Tensor]:
        """[mismatched, drifted, routed] token x layer counts of the step (device, float)."""
        return [t.to(torch.float32) for t in (self.mismatch, self.drift, self.total)]


def setup(cfg, policy, ref, device: torch.device) -> Replay | None:
    """The trainer's ``Replay`` for an MoE model (routes measured; replayed when
    ``cfg.routing_replay`` is true; measured only for ``"measure"``), attached to the policy
    and the KL reference; None when dense."""
    shape = route_shape(policy.causal_lm.config)
    if shape is None:
        return None
    replay = Replay(shape, replay=getattr(cfg, "routing_replay", False) is True, device=device)
    replay.attach(policy.causal_lm)
    if ref is not None:
        replay.attach(ref.causal_lm)
    return replay
