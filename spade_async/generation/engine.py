"""Continuous-batching generation core of the CPU engine (transformers + DynamicCache).

One scheduler thread owns the model and a batch of running sequences. Each loop turn it
either prefills newly arrived requests (batched, left-padded, ``logits_to_keep=1``) and
merges their KV cache into the running batch, or runs one batched decode step over every
running sequence. Sequences leave the batch as soon as they finish (stop token, stop
string, ``max_new_tokens``, context limit, abort), new ones join between decode steps.

Two halves. This module holds what other threads touch, under one lock (``_cond``): the
waiting queue, the pause / abort / retract flags, a pending weight swap, released memory
tags, and the thread-safe public calls. ``engine_batch.BatchWork`` holds the scheduler
thread's own state and work, touched by no other thread: the running rows, their KV cache
and mask, the prefix cache, prefill, decode and sampling.

The KV cache is a transformers ``DynamicCache`` whose per-layer ``keys``/``values`` are
``[B, H, T, D]``; rows are left-padded and an attention mask ``mask_BT`` marks real
positions. Keys are stored after RoPE with each row's own positions (``position_ids`` =
number of real tokens before it), so rows of different ages can be concatenated freely.

Log-probs follow ``logprob_convention.sampling_logprobs`` (temperature-scaled softmax,
before top-k/top-p/min-p). Requests are handed back through ``concurrent.futures.Future``.

Legend: B running rows, G rows being prefilled, T cached positions, L prompt length,
V vocab, H kv heads, D head dim, S new (uncached) tokens of a prefix-cache hit, U unique
prompts of a prefill group (identical prompts prefilled once).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import deque
from typing import Any

import torch

from spade_async.generation import packed, ragged, route_capture
from spade_async.generation.engine_batch import PAD_WASTE, BatchWork, _length_groups  # noqa: F401
from spade_async.generation.engine_types import EngineBusy, Sequence, Swap
from spade_async.generation.kv_cache import PrefixCache
from spade_async.generation.priority import PriorityPolicy, preemption_victim, waiting_order
from spade_async.generation.protocol import FinishReason
from spade_async.generation.retract import retract_running
from spade_async.generation.sampling import sample_tokens

__all__ = ["MEMORY_TAGS", "Engine", "EngineBusy", "Sequence", "sample_tokens"]

# SGLang's release/resume_memory_occupation tags (constants.py GPU_MEMORY_ALL_TYPES; the CPU
# engine has no CUDA graph: that tag only counts); sglang_state.py keeps their bookkeeping
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
PREFIX_CACHE_BYTES = 256 << 20  # finished requests' KV kept for their next turn (PrefixCache)


class Engine(BatchWork):
    """Owns the model; ``submit`` from any thread, results arrive on each sequence's future."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_running: int = 64,
        max_prefill_tokens: int = 8192,
        weight_version: str = "0",
        priority: PriorityPolicy | None = None,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        routed_experts: bool = False,
    ) -> None:
        """``priority`` (SGLang's ``--enable-priority-scheduling`` and its flags): when
        enabled, the waiting queue is taken in priority order, then first come first served
        (``waiting_order``). With the batch full, a waiting request more than
        ``priority.preemption_threshold`` better than the worst running one takes its place
        (``preemption_victim``; None: never, ``--disable-priority-preemption``): the worst
        (the newest among equals) goes back to the queue with its tokens so far, and resumes
        from them. ``prefix_cache_bytes``: room for finished requests' KV, so that the next
        turn of a conversation prefills only its new tokens (``PrefixCache``; 0 turns it off,
        SGLang's ``--disable-radix-cache``). ``routed_experts``: SGLang's
        ``--enable-return-routed-experts`` (route_capture.py)."""
        self.model = model
        self.routed_experts = routed_experts
        if routed_experts:
            route_capture.of(model)  # hooks on its routers before the first forward
        ragged.enable(model)
        packed.pack(model)
        self.tokenizer = tokenizer
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.weight_version = weight_version
        self.priority = priority or PriorityPolicy()
        self._arrivals = itertools.count()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = _eos_ids(model, tokenizer)
        self._pending: deque[Sequence] = deque()
        self._cond = threading.Condition()
        self._paused = False
        self._abort_all = self._retract = False  # _retract: retract.py, on the scheduler
        self._swap: Swap | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.released: set[str] = set()  # memory tags given back (colocated training)
        self.prefix = PrefixCache(prefix_cache_bytes)  # touched only by the scheduler thread
        self._flush_prefix = False  # set by other threads, done by the scheduler thread
        self._shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        # batch state, touched only by the scheduler thread
        self.active: list[Sequence] = []
        self.cache: Any = None
        self.mask_BT: torch.Tensor | None = None
        self.stats = {"prefills": 0, "prefill_tokens": 0, "decode_steps": 0, "max_batch": 0,
                      "tokens": 0, "preemptions": 0, "prefix_hit_tokens": 0}  # fmt: skip

    # ---- public, thread-safe -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="spade-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, seqs: list[Sequence]) -> None:
        with self._cond:
            if self.released:
                raise EngineBusy(
                    f"engine memory is released ({', '.join(sorted(self.released))}); "
                    "POST /resume_memory_occupation first"
                )
            for seq in seqs:
                seq.arrival = next(self._arrivals)
            self._pending.extend(seqs)
            if self.priority.enabled:
                self._pending = deque(waiting_order(self._pending, self.priority.sign))
            self._cond.notify_all()

    def load(self) -> int:
        with self._cond:
            return len(self._pending) + len(self.active)

    def pause(self, *, abort: bool, retract: bool = False) -> None:
        """Stop stepping; ``abort`` ends every request, ``retract`` re-queues running ones."""
        with self._cond:
            self._paused = True
            self._abort_all = self._abort_all or abort
            self._retract = retract and not abort
            waiting = list(self._pending) if abort else []
            if abort:
                self._pending.clear()
            self._cond.notify_all()
        for seq in waiting:
            seq.finish = FinishReason(type="abort", message="aborted by pause_generation")
            self._resolve(seq)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def release_memory(self, tags: list[str] | None = None) -> None:
        """Give back the weights' storage and/or the KV cache (SGLang's memory saver, used
        when the trainer shares the device). Only while idle, as in SGLang; weights come
        back by ``resume_memory`` with undefined contents until the next weight update."""
        chosen = _tags(tags)
        with self._cond:
            busy = len(self._pending) + len(self.active)
            if busy or self._swap is not None:
                raise EngineBusy(
                    f"release_memory_occupation needs an idle engine ({busy} requests running "
                    "or waiting): pause_generation(mode='abort') or let them finish first"
                )
            if "weights" in chosen and "weights" not in self.released:
                packed.unpack(self.model)
                for name, p in self.model.named_parameters():
                    self._shapes[name] = (p.shape, p.dtype)
                    p.data = torch.empty(0, dtype=p.dtype)
            if "kv_cache" in chosen:
                self._reset_batch()
            self._flush_prefix = True  # its KV goes with the memory, or the weights change
            self.released |= chosen

    def resume_memory(self, tags: list[str] | None = None) -> None:
        """Take memory back (``None``: every tag, as SGLang). Weights are re-allocated empty:
        push weights before generating, as after SGLang's resume without a CPU backup."""
        chosen = _tags(tags)
        with self._cond:
            if "weights" in chosen and "weights" in self.released:
                for name, p in self.model.named_parameters():
                    shape, dtype = self._shapes.pop(name)
                    p.data = torch.empty(shape, dtype=dtype)
                self._flush_prefix = True
            self.released -= chosen

    def flush_prefix_cache(self) -> None:
        """Drop the finished requests' KV (``/flush_cache``); done before the next prefill."""
        with self._cond:
            self._flush_prefix = True

    def swap_model(self, model: Any, version: str, *, abort: bool) -> concurrent.futures.Future:
        """Swap weights once running sequences finish (or are aborted; new ones wait), or at
        once while paused in place (SGLang ``in_place``: running rows keep their KV cache and
        continue on the new weights after ``resume``)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._swap = Swap(model, version, abort, fut)
            self._cond.notify_all()
        return fut

    # ---- scheduler thread ----------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                new: list[Sequence] = []
                with self._cond:
                    while not self._stopping and not self._has_work():
                        self._cond.wait(timeout=1.0)
                    if self._stopping:
                        break
                    abort_all, self._abort_all = self._abort_all, False
                    retract, self._retract = self._retract, False
                    swap = self._swap
                    if swap is not None and swap.abort:
                        abort_all = True
                    paused = self._paused
                    flush, self._flush_prefix = self._flush_prefix, False
                    if not paused and swap is None:
                        new = self._take_pending()
                if flush:
                    self.prefix.clear()
                if abort_all:
                    self._abort_running("aborted by pause_generation or a weight update")
                if retract:
                    retract_running(self)  # re-prefilled on continue, under its weights then
                if swap is not None and (paused or not self.active):
                    self._do_swap(swap)  # paused in place: running rows resume on new weights
                    continue
                if paused:
                    continue
                try:
                    if new:
                        self._prefill(new)
                    elif self.active:
                        self._decode()
                except Exception as exc:  # a broken step fails its requests, not the server
                    for seq in new + self.active:
                        if not seq.future.done():
                            seq.future.set_exception(exc)
                    self._reset_batch()
            self._abort_running("engine stopped")
            for seq in self._pending:
                seq.future.cancel()

    def _has_work(self) -> bool:
        swap_due = self._swap is not None and (self._paused or not self.active)
        if self._abort_all or self._retract or swap_due:
            return True
        if self._paused:
            return False
        return bool(self._pending or self.active)

    def _take_pending(self) -> list[Sequence]:
        taken, tokens = [], 0
        while self._pending:
            nxt = len(self._pending[0].context())
            if taken and tokens + nxt > self.max_prefill_tokens:
                break
            if len(self.active) + len(taken) >= self.max_running and not self._preempt_for(
                self._pending[0]
            ):
                break
            taken.append(self._pending.popleft())
            tokens += nxt
        return taken

    def _preempt_for(self, seq: Sequence) -> bool:
        """Free a row of the full batch for ``seq`` if its priority beats the worst running
        row's by more than the threshold (SGLang's ``preempt_to_schedule``, one row per
        admitted request); the preempted row waits again, after ``seq``."""
        policy = self.priority
        if not policy.enabled or policy.preemption_threshold is None:
            return False
        sign = policy.sign
        worst = preemption_victim(self.active, seq, sign, policy.preemption_threshold)
        if worst is None:
            return False
        out = self.active[worst]
        self._select([i for i in range(len(self.active)) if i != worst])
        out.preemptions += 1
        self.stats["preemptions"] += 1
        self._pending = deque(waiting_order([*self._pending, out], sign))
        return True

    def _do_swap(self, swap: Swap) -> None:
        with self._cond:  # rows kept across the swap, and preempted ones waiting: older tokens
            kept = [*self.active, *(q for q in self._pending if q.output_ids)]
        for seq in kept:
            if seq.output_ids:
                seq.version_events.append((self.weight_version, len(seq.output_ids)))
        self.model, self.weight_version = swap.model, swap.version
        if self.routed_experts:
            route_capture.of(self.model)
        self.prefix.clear()  # KV computed under the old weights is never reused
        ragged.enable(self.model)
        packed.pack(self.model)
        with self._cond:
            self.released.discard("weights")  # a new model brings its own weights
            self._shapes.clear()
            if self._swap is swap:
                self._swap = None
        swap.future.set_result(swap.version)


def _tags(tags: list[str] | None) -> set[str]:
    """The regions ``tags`` names (None or []: all, as SGLang); other names hold no memory
    here (SGLang keeps them in its offload set too: ``sglang_state.py`` does the books)."""
    return set(tags or MEMORY_TAGS) & set(MEMORY_TAGS)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def now_seed() -> int:
    return time.time_ns() & 0x7FFF_FFFF
