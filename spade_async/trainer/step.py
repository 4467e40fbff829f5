"""One optimisation step: packed micro-batches -> fused log-probs -> policy loss -> AdamW.

Legend: T tokens of a micro-batch (flattened), R ranks, K loss tokens of a micro-batch, S
samples of the batch.

No host sync inside the micro-batch loop: metrics accumulate as device tensors. There is
exactly one sync per step, the finiteness check of the loss and global gradient norm that
decides whether the optimizer steps (the same decision GradScaler makes). A NaN/inf loss or
gradient skips the step: gradients are dropped, weights, optimizer and schedule untouched,
and ``skipped_steps`` counts it.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist
from spade_kernels import PolicyTerms, loss_weights, policy_loss

from spade_async.trainer.batch import Batch, validate_batch
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.loss_settings import LossSettings
from spade_async.trainer.model import PolicyModel, load_policy
from spade_async.trainer.packing import (
    LAYOUTS,
    build_microbatch,
    loss_denominator,
    plan_microbatches,
    unit_tokens,
)

__all__ = ["Trainer", "lr_lambda"]


def lr_lambda(cfg: TrainerConfig):
    """Linear warm-up to 1, then cosine to ``min_lr_ratio`` over ``total_steps`` (0: constant)."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.total_steps <= 0:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / cfg.total_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


class Trainer:
    """Model + optimizer + schedule on one rank; every rank runs the same calls in lockstep."""

    def __init__(
        self, cfg: TrainerConfig, model_dir: str | Path, device: torch.device | None = None
    ):
        self.cfg = cfg
        self._loss_settings = (cfg, LossSettings.from_config(cfg))  # once, for every step
        self.model_dir = Path(model_dir)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        self.device = device or torch.device("cpu")
        self.sp = max(1, cfg.sequence_parallel)
        if self.sp > 1 and (not self.distributed or self.world % self.sp):
            from spade_async.errors import ConfigError

            raise ConfigError(
                f"trainer.sequence_parallel = {self.sp} needs a multiple of {self.sp} trainer "
                f"ranks (have {self.world})"
            )
        if self.sp > 1 and cfg.loss_agg == "seq-mean-token-mean" and cfg.head != "fused":
            from spade_async.errors import ConfigError

            raise ConfigError(
                "trainer.sequence_parallel > 1 with loss_agg = 'seq-mean-token-mean' needs "
                "trainer.head = 'fused' (its per-token weights come from the whole row; the "
                "recompute head aggregates within a slice): set trainer.head = 'fused'"
            )
        torch.manual_seed(cfg.seed + self.rank)
        self.model: PolicyModel = load_policy(cfg, model_dir, self.device, shard=self.distributed)
        # KL reference: the initial policy, frozen, sharded like the policy (one more fp32 copy
        # of the weights, 4 B/param / R); model_dir is the base model even on a resume
        self.ref_model: PolicyModel | None = None
        # LoRA: the base with the adapters off *is* the initial policy (no extra copy)
        self.ref_adapters_off = cfg.lora is not None and cfg.kl_coef > 0
        self.ref_adapters_off &= cfg.kl_reference == "initial"
        if cfg.kl_coef > 0 and cfg.kl_reference == "initial" and not self.ref_adapters_off:
            ref_cfg = msgspec.structs.replace(cfg, activation_checkpointing="none")
            self.ref_model = load_policy(ref_cfg, model_dir, self.device, shard=self.distributed)
            self.ref_model.requires_grad_(False)
            self.ref_model.eval()
        from spade_async.trainer.routing import setup as routing_setup

        self.routing = routing_setup(cfg, self.model, self.ref_model, self.device)  # MoE: R3
        self.sp_group = None
        if self.sp > 1:  # Ulysses: the same packed row on sp ranks, each a slice of it
            from spade_async.trainer.sequence_parallel import setup

            self.sp_group = setup(self.model, self.sp, self.rank, self.world)
        self.vocab_size = int(self.model.causal_lm.config.vocab_size)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # LoRA: the adapters
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            fused=self.device.type == "cuda",  # one multi-tensor kernel per step on GPU
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.step = 0  # optimizer steps taken
        self.version = 0  # policy version: bumps with every applied step
        self.skipped_steps = 0
        self.control_group = None  # gloo group for RPC broadcasts (set by main on NCCL)

    @property
    def loss_settings(self) -> LossSettings:
        """The loss's settings, built once from ``cfg`` (again only if ``cfg`` is replaced)."""
        if self._loss_settings[0] is not self.cfg:
            self._loss_settings = (self.cfg, LossSettings.from_config(self.cfg))
        return self._loss_settings[1]

    def _ref_logprobs(self, mb) -> torch.Tensor | None:
        """low_var_kl target: the frozen initial policy (forward only), the rollout, or None."""
        if self.cfg.kl_coef <= 0:
            return None
        if self.ref_adapters_off:  # LoRA: the frozen base is the initial policy
            from spade_async.trainer.lora import adapters_off

            free = self.routing is not None and self.cfg.kl_reference_routes == "free"
            routes = self.routing.routing_freely() if free else contextlib.nullcontext()
            with torch.no_grad(), adapters_off(self.model), routes:  # routing.py: KL reference
                return _logprobs(self.model, mb)
        if self.ref_model is None:
            return mb.rollout_logprob_T
        with torch.no_grad():
            return _logprobs(self.ref_model, mb)

    def _loss(
        self,
        mb,
        denominator: float,
        weights_T: torch.Tensor | None = None,
        unit_tokens_S: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``weights_T``: the per-token loss weights when the caller computed them on more
        than ``mb`` (a sequence-parallel slice of a row); else from ``mb`` itself.
        ``unit_tokens_S``: per batch sample, its unit's loss tokens (seq-mean-token-mean: an
        episode's turn samples share one mean, whatever micro-batch or rank they land on)."""
        cfg, ls = self.cfg, self.loss_settings
        ref_T = self._ref_logprobs(mb)
        rollout_T = mb.rollout_logprob_T if ls.use_tis else None
        seq_ids = mb.local_seq_T if ls.per_sequence else None
        seq_tokens_T = None if unit_tokens_S is None else unit_tokens_S[mb.seq_T.clamp(min=0)]
        # The denominator is the whole batch's (global) count, divided by R because FSDP
        # averages gradients over ranks and the batch loss is their sum.
        scale = denominator / self.world
        model_kw = dict(
            return_entropy=ls.want_entropy,
            index_K=mb.loss_index_K,
            cu_seqlens=mb.cu_seqlens,
            max_seqlen=mb.max_seqlen,
        )
        fused = cfg.head == "fused"
        if fused:  # loss and its gradient w.r.t. the head in one pass (kernels/head.py)
            terms = PolicyTerms(
                loss_weights(
                    mb.mask_T.double(),  # 1 / denominator unrounded for a float64 model
                    ls.agg,
                    seq_ids_T=seq_ids,
                    loss_scale_denominator=scale,
                    seq_tokens_T=seq_tokens_T,
                )
                if weights_T is None
                else weights_T,
                mb.advantage_T,
                old_logprob_T=None if ls.old_detached else mb.rollout_logprob_T,
                rollout_logprob_T=rollout_T,
                ref_logprob_T=ref_T if ls.kl_coef > 0 else None,
                **ls.shared(),
            )
            head = self.model(
                mb.input_ids,
                mb.position_ids,
                mb.target_T,
                mb.attention_mask,
                terms=terms,
                **model_kw,
            )
            logprob_T, entropy_T = head.logprob_T, head.entropy_T
        else:
            out = self.model(
                mb.input_ids, mb.position_ids, mb.target_T, mb.attention_mask, **model_kw
            )
            logprob_T, entropy_T = out if ls.want_entropy else (out, None)
        old_T = logprob_T.detach() if ls.old_detached else mb.rollout_logprob_T
        # fused: the same function on the detached log-probs gives the metrics (O(T) work)
        with torch.no_grad() if fused else contextlib.nullcontext():
            loss, metrics = policy_loss(
                logprob_T,
                old_T,
                mb.advantage_T,
                mb.mask_T,
                agg=ls.agg,
                rollout_logprob_T=rollout_T,
                ref_logprob_T=ref_T,
                entropy_T=entropy_T,
                seq_ids_T=seq_ids,
                loss_scale_denominator=scale,
                seq_tokens_T=seq_tokens_T,
                **ls.shared(),
            )
        if fused:
            loss = head.loss
        # train/inference mismatch before the update, on the sampled (loss) tokens:
        # d = log p_engine - log p_trainer; KL(engine || trainer) by the k3 estimator
        # exp(-d) - 1 + d (>= 0, unbiased under the engine's samples; the exponent is capped
        # at 30 so a token the engine found far less likely than the trainer cannot overflow)
        d_T = (mb.rollout_logprob_T - logprob_T.detach()) * mb.mask_T
        n = metrics["tokens"].clamp(min=1)
        metrics["logprob_gap"] = d_T.abs().sum() / n
        metrics["mismatch_kl"] = (torch.expm1((-d_T).clamp(max=30.0)) + d_T).sum() / n
        metrics["mismatch_max"] = d_T.abs().max() if d_T.numel() else d_T.new_zeros(())
        # the importance weights p_trainer / p_engine before any cap: mean and mean square
        # (the spread: std = sqrt(E[w^2] - E[w]^2)); masked tokens count 0, as everywhere
        w_T = torch.exp((-d_T).clamp(max=30.0)) * mb.mask_T
        metrics["is_weight_mean"] = w_T.sum() / n
        metrics["is_weight_sq"] = (w_T * w_T).sum() / n
        metrics.pop("loss")
        metrics.pop("sequences", None)
        return loss, metrics

    def accumulate(
        self, batch: Batch, layout: str | None = None
    ) -> tuple[torch.Tensor, list[str], int]:
        """Forward + backward over this rank's micro-batches; gradients stay in ``.grad``.

        Returns a device vector [loss, *token-weighted metric sums, loss tokens, tokens]
        (this rank's share; sum it over ranks), the metric names and the micro-batch count.
        """
        samples = batch.samples
        layout = layout or ("packed" if self.cfg.packing else "padded")
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        packed = layout == "packed"
        pad_to = max(len(s.token_ids) for s in samples) if layout == "padded_max" else 0
        # units that count but train nothing (Batch.loss_normaliser) included
        denominator = loss_denominator(samples, self.cfg.loss_agg, batch.loss_normaliser)
        unit_tokens_S = units_dev = None
        if self.cfg.loss_agg == "seq-mean-token-mean":
            unit_tokens_S = torch.tensor(unit_tokens(samples), dtype=torch.float64)
            units_dev = unit_tokens_S.to(self.device)
        if self.sp > 1 and not packed:
            raise ValueError("sequence parallel trains packed rows: layout must be 'packed'")
        slots = self.world // self.sp  # an SP group shares one slot's micro-batches
        plan = plan_microbatches(
            [len(s.token_ids) for s in samples],
            slots,
            self.cfg.micro_batch_tokens * self.sp,  # a row split over sp ranks
            packed=packed,
            sorted_buckets=layout == "padded_sorted",
        )
        acc: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=self.device)
        loss_tokens = torch.zeros((), device=self.device)
        mismatch_max = torch.zeros((), device=self.device)  # a max, not a token-weighted sum
        n_tokens = 0
        if self.routing is not None:
            self.routing.prepare(samples)
            self.routing.reset()
        for indices in plan[self.rank // self.sp]:
            mb = build_microbatch(samples, indices, packed=packed, pad_to=pad_to)
            weights_T = None
            if self.sp > 1:
                from spade_async.trainer.sequence_parallel import shard, token_slice

                if self.cfg.loss_agg == "seq-mean-token-mean":
                    # a slice sees part of a sample: mask / (n_s x D), n_s from the whole row
                    weights_T = loss_weights(
                        mb.mask_T.double(),
                        self.cfg.loss_agg,
                        seq_ids_T=mb.local_seq_T,
                        loss_scale_denominator=denominator / self.world,
                        seq_tokens_T=unit_tokens_S[mb.seq_T.clamp(min=0)],
                    )
                    weights_T = token_slice(weights_T, self.rank % self.sp, self.sp)
                    weights_T = weights_T.to(self.device)
                mb = shard(mb, self.rank % self.sp, self.sp)
            if self.routing is not None:
                self.routing.set_microbatch(mb)  # the engine's routes of these tokens
            mb = mb.to(self.device)
            loss, metrics = self._loss(mb, denominator, weights_T, units_dev)
            loss.backward()
            if self.routing is not None:
                self.routing.clear()
            loss_sum += loss.detach()
            n_tokens += mb.n_tokens
            tok = metrics.pop("tokens")
            mismatch_max = torch.maximum(mismatch_max, metrics.pop("mismatch_max"))
            loss_tokens += tok
            for k, v in metrics.items():
                acc[k] = acc.get(k, 0) + v * tok
        if self.routing is not None:  # counts, not token-weighted: train_step divides them
            for k, v in zip(ROUTE_KEYS, self.routing.step_values(), strict=True):
                acc[k] = v
        keys = sorted(acc)
        self.mismatch_max = mismatch_max  # read by train_step after its one sync
        vec = torch.stack(
            [
                loss_sum / self.world,
                *[acc[k] for k in keys],
                loss_tokens,
                torch.tensor(float(n_tokens), device=self.device),
            ]
        )
        return vec, keys, len(plan[self.rank // self.sp])

    def train_step(
        self, batch: Batch, *, validated: bool = False, layout: str | None = None
    ) -> dict[str, float]:
        """Validate (unless the caller did), run every micro-batch of this rank, then step.

        ``layout`` (one of ``packing.LAYOUTS``) overrides ``cfg.packing`` for this step
        (benchmarks compare layouts).
        """
        t0 = time.perf_counter()
        if not validated:
            validate_batch(batch, self.vocab_size)
        vec, keys, n_micro = self.accumulate(batch, layout)
        grad_norm = self._clip_grad_norm()
        mismatch_max = self.mismatch_max
        if self.distributed:
            dist.all_reduce(vec)
            dist.all_reduce(mismatch_max, op=dist.ReduceOp.MAX)
        finite = bool(torch.isfinite(vec[0]) & torch.isfinite(grad_norm))  # the one sync
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            self.version += 1
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        values = vec.tolist()
        loss_tokens, tokens = values[-2], values[-1]
        seconds = time.perf_counter() - t0
        metrics = {"loss": values[0], "grad_norm": float(grad_norm)}
        metrics["mismatch_max"] = float(mismatch_max)  # after the sync above: no new wait
        metrics.update({k: values[1 + i] / max(loss_tokens, 1.0) for i, k in enumerate(keys)})
        metrics.update(
            loss_tokens=loss_tokens,
            tokens=tokens,
            samples=float(len(batch.samples)),
            seconds=seconds,
            tokens_per_s=tokens / max(seconds, 1e-9),
            lr=self.scheduler.get_last_lr()[0],
            step=float(self.step),
            version=float(self.version),
            skipped=float(not finite),
            skipped_steps=float(self.skipped_steps),
            micro_batches=float(n_micro),
        )
        if self.routing is not None:
            _route_metrics(metrics, self.routing)
        return metrics

    def _clip_grad_norm(self) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP2: the global norm
            norm = norm.full_tensor()
        return norm


ROUTE_KEYS = ("route_mismatched_n", "route_drifted_n", "route_routed_n", "route_replayed_n",
              "route_needed_n", "route_layout_n")  # fmt: skip


def _route_metrics(metrics: dict[str, float], routing) -> None:
    """Route metrics from the step's counts (all divided by the same loss-token count above:
    multiplied back, so shares are exact and counts whole); ``routing.metrics`` names them."""
    scale = max(metrics["loss_tokens"], 1.0)
    routing.metrics(metrics, [metrics.pop(k) * scale for k in ROUTE_KEYS])


def _logprobs(model: PolicyModel, mb) -> torch.Tensor:
    """Forward-only log-probs of ``mb``'s loss tokens (the KL reference pass)."""
    return model(
        mb.input_ids,
        mb.position_ids,
        mb.target_T,
        mb.attention_mask,
        index_K=mb.loss_index_K,
        cu_seqlens=mb.cu_seqlens,
        max_seqlen=mb.max_seqlen,
    )
