"""Rollout routing replay (R3) in the trainer's MoE blocks, and the route mismatch it removes.

A bf16 engine and an fp32 trainer route some tokens to different experts; the importance
ratio then compares two networks. With ``trainer.routing_replay`` every MoE layer takes the
experts the engine recorded for each token (``Sample.routed_experts``) and weighs them with
the trainer's *own* router: softmax over all experts in fp32, gathered at the recorded ids,
renormalised by the router class's rule (``route_sanity.renormalises``: Qwen3-MoE by its
``norm_topk_prob``, Mixtral always; an unknown family is refused at start). That is slime's
rule: ``slime/utils/routing_replay.py`` (``replay_forward``: ``probs = scores.gather(1,
top_indices)``, scores being the router's softmax), so the gradient still reaches the router
through those weights.

Nothing routes freely unseen: ``route_sanity.prepare`` decides per token row and layer what
replays and counts the rest by reason (a sample without routes, a misfit, a short sample,
``-1``, all-zero or duplicate-id rows); a router that sees a token count other than the
micro-batch's (a packing or sequence-parallel layout bug) routes that layer freely and is
counted (``layout``) with one error line. ``route_replayed_share`` = token x layer routes
replayed / token x layer routes a trained token depends on; with replay on, a step below
0.99 warns in one line (once per dip) naming the reasons.

How: a forward hook on every router (transformers' ``*TopKRouter``, output ``(logits,
scores, indices)``) swaps in the recorded indices and the re-gathered weights; the experts
(grouped or looped) consume them unchanged. Each micro-batch's routes are looked up by
(sample, position) from ``seq_T`` and ``position_ids``, so packing, padding, micro-batches
and a sequence-parallel slice (its own tokens only) all get the rows of their tokens.

The KL reference (``trainer.kl_reference_routes``): ``"free"`` (default) routes with its own
router, as slime's reference pass does (``routing_replay.stage(FALLTHROUGH)`` around
``_compute_log_prob("ref", ...)`` in slime's Megatron actor): the KL compares the policy as
the engine routed with the initial policy as it would route itself (at step 0 the KL is
small but not 0: the two routings differ on some tokens). ``"replay"`` gives the reference
the same recorded routes (a frozen copy: hooks on it too; LoRA: the adapters-off pass keeps
the hooks): the KL then measures the weights' drift under fixed routes only (0 at step 0).
A re-forward under activation checkpointing replays the same rows again.

Counters: ``route_mismatch`` counts token x layer routes whose experts (as a set) differ
from the engine's among those the policy forward *used* (0 with replay), ``route_drift``
those the trainer's own router would pick differently (device tensors, no host sync); the
replayed and needed counts are host integers known before the forward. Only the policy's
forward counts (the reference's runs without grad; a checkpoint re-forward comes after the
last layer's hook).

Legend: T tokens of a micro-batch (as the router sees them, flattened), L MoE layers, K
top-k, N samples, R route rows of one step, E experts of a layer.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from spade_async.generation.route_capture import routers
from spade_async.generation.routed_experts import RouteShape, route_shape
from spade_async.trainer import route_sanity
from spade_async.trainer.route_sanity import REASONS, RouteRuleError, renormalises

__all__ = ["Replay", "setup", "LOW_SHARE"]

_log = logging.getLogger(__name__)
LOW_SHARE = 0.99  # below this share of replayed routes a run with replay on warns


class Replay:
    """The routes of the step in flight and the hooks that use them."""

    def __init__(self, shape: RouteShape, *, replay: bool, device: torch.device) -> None:
        self.shape, self.replay, self.device = shape, replay, device
        self.prep = route_sanity.prepare([], shape)
        self.ids_TLK: torch.Tensor | None = None  # the micro-batch in flight
        self.ok_TL: torch.Tensor | None = None
        self.rep_L: list[int] = [0] * shape.layers  # needed routes each layer would replay
        self.counting = False
        self.suspended = False  # a forward that routes freely (the KL reference, "free")
        self.low = False  # the last step warned (one line per dip)
        self._layout_logged = False
        self.reset()

    def attach(self, causal_lm) -> None:
        found = routers(causal_lm)
        if len(found) != self.shape.layers:
            raise ValueError(f"{len(found)} MoE routers for {self.shape.layers} layers")
        for layer, module in enumerate(found):
            try:
                renorm = renormalises(module)
            except RouteRuleError:
                if self.replay:
                    raise
                renorm = None  # measured only; replaying later raises
            module.register_forward_hook(self._hook(layer, module, renorm))

    def reset(self) -> None:
        z = torch.zeros((), dtype=torch.long, device=self.device)
        self.mismatch, self.drift, self.total = z.clone(), z.clone(), z.clone()
        self.replayed = self.needed = self.layout = 0  # token x layer, host integers
        self.per_micro: list[torch.Tensor] = []  # mismatch share of each micro-batch (bench)

    @property
    def missing(self) -> int:
        return self.prep.samples["missing"]

    @property
    def bad(self) -> int:
        return self.prep.samples["misfit"]

    # ---- host side: once per step, then once per micro-batch ------------------------------
    def prepare(self, samples) -> None:
        """Decode every sample's routes once and judge each row (``route_sanity``)."""
        self.prep = route_sanity.prepare(samples, self.shape)

    def set_microbatch(self, mb) -> None:
        """The recorded routes of ``mb``'s tokens (by sample and position; host tensors)."""
        p = self.prep
        seq_T = mb.seq_T.reshape(-1)
        pos_T = mb.position_ids.reshape(-1)
        s_T = seq_T.clamp(min=0)
        need_T = (seq_T >= 0) & (pos_T < p.need_N[s_T])
        self.needed += int(need_T.sum()) * self.shape.layers
        self.counting = True
        self.per_micro.append(torch.zeros((), device=self.device))
        if not int(p.rows_N.sum()):  # no sample of the step has routes: nothing to replay
            self.ids_TLK = self.ok_TL = None
            self.rep_L = [0] * self.shape.layers
            return
        has_T = (seq_T >= 0) & (pos_T < p.rows_N[s_T])
        index_T = torch.where(has_T, p.offset_N[s_T] + pos_T, p.all_RLK.shape[0] - 1)
        ok_TL = p.ok_RL[index_T] & has_T[:, None]
        self.rep_L = (ok_TL & need_T[:, None]).sum(0).tolist()
        self.ids_TLK = p.all_RLK[index_T].long().to(self.device, non_blocking=True)
        self.ok_TL = ok_TL.to(self.device, non_blocking=True)

    def clear(self) -> None:
        self.ids_TLK = self.ok_TL = None
        self.counting = False

    @contextlib.contextmanager
    def routing_freely(self):
        """Forwards inside route with their own routers and count nothing."""
        self.suspended, before = True, self.suspended
        try:
            yield
        finally:
            self.suspended = before

    # ---- device side: inside the forward ---------------------------------------------------
    def _hook(self, layer: int, module, renorm: bool | None):
        last = layer == self.shape.layers - 1
        kind = type(module).__name__

        def swap(_module, _args, output):
            if self.suspended:
                return None
            counting = self.counting and torch.is_grad_enabled()
            if counting and last:
                self.counting = False  # a checkpoint re-forward does not count again
            ids_TLK, ok_TL = self.ids_TLK, self.ok_TL
            logits_TE, _, own_TK = output
            if ids_TLK is None:
                return None
            if ids_TLK.shape[0] != own_TK.shape[0]:
                if counting:
                    self._layout_miss(layer, ids_TLK.shape[0], own_TK.shape[0])
                return None
            ok_T = ok_TL[:, layer]
            rec_TK = ids_TLK[:, layer].to(own_TK.dtype)
            if self.replay:
                if renorm is None:
                    raise RouteRuleError(f"routing replay: no known weight rule for {kind}")
                used_TK = torch.where(ok_T[:, None], rec_TK, own_TK)
                probs_TE = torch.softmax(logits_TE, dim=-1, dtype=torch.float32)
                w_TK = probs_TE.gather(1, used_TK)
                if renorm:
                    w_TK = w_TK / w_TK.sum(dim=-1, keepdim=True)
                result = (logits_TE, w_TK.to(logits_TE.dtype), used_TK)
                if counting:
                    self.replayed += self.rep_L[layer]
            else:
                used_TK, result = own_TK, None
            if counting:
                self._count(rec_TK, own_TK, used_TK, ok_T)
            return result

        return swap

    def _layout_miss(self, layer: int, want: int, got: int) -> None:
        self.layout += self.rep_L[layer]
        if not self._layout_logged:
            self._layout_logged = True
            _log.error(
                "routing replay: MoE layer %d's router saw %d tokens, the micro-batch has %d: "
                "that layer routes freely (counted as train/route_free_layout; a layout bug)",
                layer, got, want,
            )  # fmt: skip

    def _count(self, rec_TK, own_TK, used_TK, ok_T) -> None:
        with torch.no_grad():
            rec = rec_TK.sort(dim=-1).values
            differ_T = (used_TK.sort(dim=-1).values != rec).any(dim=-1) & ok_T
            drift_T = (own_TK.sort(dim=-1).values != rec).any(dim=-1) & ok_T
            n = ok_T.sum()
            self.mismatch += differ_T.sum()
            self.drift += drift_T.sum()
            self.total += n
            share = differ_T.sum() / n.clamp(min=1)
            self.per_micro[-1] = torch.maximum(self.per_micro[-1], share)

    def step_values(self) -> list[torch.Tensor]:
        """[mismatched, drifted, routed, replayed, needed, layout] token x layer counts of the
        step (device, float; the last three known on the host)."""
        host = torch.tensor([self.replayed, self.needed, self.layout], dtype=torch.float32)
        host = host.to(self.device, non_blocking=True)
        dev = [t.to(torch.float32) for t in (self.mismatch, self.drift, self.total)]
        return [*dev, *host.unbind()]

    def metrics(self, metrics: dict[str, float], counts: list[float]) -> None:
        """The step's route metrics from its summed ``counts`` (``step_values``' order,
        over every rank), and the one-line warning when the replayed share is low. The
        ``route_free_*`` reasons but ``layout`` are host counts over the whole batch (each
        rank prepares every sample), not summed over ranks."""
        mismatched, drifted, routed, replayed, needed, layout = counts
        metrics["route_mismatch"] = mismatched / routed if routed else 0.0
        metrics["route_drift"] = drifted / routed if routed else 0.0
        metrics["route_replayed_share"] = replayed / needed if needed else 1.0
        metrics["route_replay"] = float(self.replay)
        metrics["route_samples_missing"] = float(self.prep.samples["missing"])
        metrics["route_samples_bad"] = float(self.prep.samples["misfit"])
        metrics["route_samples_partial"] = float(self.prep.samples["partial"])
        free = {**self.prep.free, "layout": round(layout)}
        for reason in REASONS:
            metrics[f"route_free_{reason}"] = float(free[reason])
        low = self.replay and needed > 0 and replayed / needed < LOW_SHARE
        if low and not self.low:
            why = ", ".join(f"{k} {v}" for k, v in free.items() if v) or "no reason counted"
            _log.warning(
                "routing replay: %.1f%% of MoE token routes replayed this step (below %.0f%%); "
                "token x layer routed freely: %s",
                100 * replayed / needed, 100 * LOW_SHARE, why,
            )  # fmt: skip
        self.low = low


def setup(cfg, policy, ref, device: torch.device) -> Replay | None:
    """The trainer's ``Replay`` for an MoE model (routes measured; replayed when
    ``cfg.routing_replay`` is true; measured only for ``"measure"``), attached to the policy
    and, with ``cfg.kl_reference_routes = "replay"``, to a frozen KL reference; None when
    dense."""
    shape = route_shape(policy.causal_lm.config)
    if shape is None:
        return None
    replay = Replay(shape, replay=getattr(cfg, "routing_replay", False) is True, device=device)
    replay.attach(policy.causal_lm)
    if ref is not None and getattr(cfg, "kl_reference_routes", "free") == "replay":
        replay.attach(ref.causal_lm)
    return replay
