"""One optimisation step: packed micro-batches -> fused log-probs -> policy loss -> AdamW.

Legend: T tokens of a micro-batch (flattened), R ranks.

No host sync inside the micro-batch loop: metrics accumulate as device tensors. There is
exactly one sync per step, the finiteness check of the loss and global gradient norm that
decides whether the optimizer steps (the same decision GradScaler makes). A NaN/inf loss or
gradient skips the step: gradients are dropped, weights, optimizer and schedule untouched,
and ``skipped_steps`` counts it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist
from spade_kernels import policy_loss

from spade_async.trainer.batch import Batch, validate_batch
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.model import PolicyModel, load_policy
from spade_async.trainer.packing import (
    LAYOUTS,
    build_microbatch,
    loss_denominator,
    plan_microbatches,
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
        if self.sp > 1 and cfg.loss_agg == "seq-mean-token-mean":
            from spade_async.errors import ConfigError

            raise ConfigError(
                "trainer.sequence_parallel > 1 with loss_agg = 'seq-mean-token-mean' is not "
                "supported yet (a slice sees part of a sample): use 'token' or "
                "'seq-mean-token-sum', or sequence_parallel = 1"
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
            ref_cfg = msgspec.structs.replace(cfg, activation_checkpointing=False)
            self.ref_model = load_policy(ref_cfg, model_dir, self.device, shard=self.distributed)
            self.ref_model.requires_grad_(False)
            self.ref_model.eval()
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
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.step = 0  # optimizer steps taken
        self.version = 0  # policy version: bumps with every applied step
        self.skipped_steps = 0
        self.control_group = None  # gloo group for RPC broadcasts (set by main on NCCL)

    def _loss(self, mb, denominator: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        want_entropy = cfg.entropy_coef > 0
        out = self.model(
            mb.input_ids,
            mb.position_ids,
            mb.target_T,
            mb.attention_mask,
            return_entropy=want_entropy,
            index_K=mb.loss_index_K,
            cu_seqlens=mb.cu_seqlens,
            max_seqlen=mb.max_seqlen,
        )
        logprob_T, entropy_T = out if want_entropy else (out, None)
        old_T = logprob_T.detach() if cfg.old_logprobs == "detached" else mb.rollout_logprob_T
        ref_T = mb.rollout_logprob_T if cfg.kl_coef > 0 else None
        if self.ref_adapters_off:
            from spade_async.trainer.lora import adapters_off

            with torch.no_grad(), adapters_off(self.model):
                ref_T = self.model(
                    mb.input_ids,
                    mb.position_ids,
                    mb.target_T,
                    mb.attention_mask,
                    index_K=mb.loss_index_K,
                    cu_seqlens=mb.cu_seqlens,
                    max_seqlen=mb.max_seqlen,
                )
        elif self.ref_model is not None:
            with torch.no_grad():
                ref_T = self.ref_model(
                    mb.input_ids,
                    mb.position_ids,
                    mb.target_T,
                    mb.attention_mask,
                    index_K=mb.loss_index_K,
                    cu_seqlens=mb.cu_seqlens,
                    max_seqlen=mb.max_seqlen,
                )
        # The denominator is the whole batch's (global) count, divided by R because FSDP
        # averages gradients over ranks and the batch loss is their sum.
        loss, metrics = policy_loss(
            logprob_T,
            old_T,
            mb.advantage_T,
            mb.mask_T,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            agg=cfg.loss_agg,
            rollout_logprob_T=mb.rollout_logprob_T if cfg.tis_cap > 0 else None,
            tis_cap=cfg.tis_cap if cfg.tis_cap > 0 else 1.0,
            ref_logprob_T=ref_T,
            kl_coef=cfg.kl_coef,
            entropy_T=entropy_T,
            entropy_coef=cfg.entropy_coef,
            seq_ids_T=None if cfg.loss_agg == "token" else mb.local_seq_T,
            loss_scale_denominator=denominator / self.world,
        )
        gap_T = (logprob_T.detach() - mb.rollout_logprob_T).abs() * mb.mask_T
        metrics["logprob_gap"] = gap_T.sum() / metrics["tokens"].clamp(min=1)
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
        denominator = loss_denominator(samples, self.cfg.loss_agg)
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
        n_tokens = 0
        for indices in plan[self.rank // self.sp]:
            mb = build_microbatch(samples, indices, packed=packed, pad_to=pad_to)
            if self.sp > 1:
                from spade_async.trainer.sequence_parallel import shard

                mb = shard(mb, self.rank % self.sp, self.sp)
            mb = mb.to(self.device)
            loss, metrics = self._loss(mb, denominator)
            loss.backward()
            loss_sum += loss.detach()
            n_tokens += mb.n_tokens
            tok = metrics.pop("tokens")
            loss_tokens += tok
            for k, v in metrics.items():
                acc[k] = acc.get(k, 0) + v * tok
        keys = sorted(acc)
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
        if self.distributed:
            dist.all_reduce(vec)
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
        return metrics

    def _clip_grad_norm(self) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP2: the global norm
            norm = norm.full_tensor()
        return norm
