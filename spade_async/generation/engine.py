"""Continuous-batching generation core of the CPU engine (transformers + DynamicCache).

One scheduler thread owns the model and a batch of running sequences. Each loop turn it
either prefills newly arrived requests (batched, left-padded, ``logits_to_keep=1``) and
merges their KV cache into the running batch, or runs one batched decode step over every
running sequence. Sequences leave the batch as soon as they finish (stop token, stop
string, ``max_new_tokens``, context limit, abort), new ones join between decode steps.

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
from dataclasses import dataclass, field
from typing import Any

import torch

from spade_async.generation import packed, ragged, route_capture
from spade_async.generation.kv_cache import PrefixCache, cache_kw, left_pad, slab_cache
from spade_async.generation.logprob_convention import sampling_logprobs
from spade_async.generation.priority import PriorityPolicy, preemption_victim, waiting_order
from spade_async.generation.protocol import FinishReason, SamplingParams
from spade_async.generation.retract import retract_running
from spade_async.generation.sampling import sample_tokens

__all__ = ["MEMORY_TAGS", "Engine", "EngineBusy", "Sequence", "sample_tokens"]

# SGLang's release/resume_memory_occupation tags (constants.py GPU_MEMORY_ALL_TYPES; the CPU
# engine has no CUDA graph: that tag only counts); sglang_state.py keeps their bookkeeping
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
PREFIX_CACHE_BYTES = 256 << 20  # finished requests' KV kept for their next turn (PrefixCache)


class EngineBusy(RuntimeError):
    """A request the engine cannot take in its current state (memory released, or busy)."""


@dataclass
class Sequence:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text_end: int | None = None  # stop-string trim position in the decoded text
    weight_version: str = ""  # the weights of the last token
    priority: int = 0  # the waiting queue's order under priority scheduling (Engine)
    arrival: int = 0  # submission order (ties of priority; the newest is preempted first)
    preemptions: int = 0  # times it was taken out of the batch for a higher priority
    # --enable-return-routed-experts and the request asked (route_capture.py): the rows
    # from route_start on; routes holds (first position, ids [n, L, K]) per forward
    want_routes: bool = False
    route_start: int = 0
    routes: list = field(default_factory=list)

    def context(self) -> list[int]:
        """What a prefill runs on: the prompt, and the tokens generated before a preemption
        (the request resumes where it was, as SGLang's retracted requests do)."""
        return self.prompt_ids + self.output_ids if self.output_ids else self.prompt_ids

    # (version, tokens generated before it was replaced) per weight swap while running
    version_events: list[tuple[str, int]] = field(default_factory=list)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Swap:
    model: Any
    version: str
    abort: bool
    future: concurrent.futures.Future


class Engine:
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
        self._swap: _Swap | None = None
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
            self._swap = _Swap(model, version, abort, fut)
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

    def _do_swap(self, swap: _Swap) -> None:
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

    def _reset_batch(self) -> None:
        self.active, self.cache, self.mask_BT = [], None, None

    def _abort_running(self, message: str) -> None:
        for seq in self.active:
            seq.finish = FinishReason(type="abort", message=message)
            self._resolve(seq)
        self._reset_batch()

    def _prefill(self, seqs: list[Sequence]) -> None:
        cold, warm = list(seqs), []
        if len(self.prefix):
            cold = []
            for seq in seqs:
                n, kv = self.prefix.longest(seq.context())
                if seq.want_routes:  # cached tokens' routes are gone: recompute from the start
                    n = min(n, seq.route_start)
                if n:
                    warm.append((seq, n, kv))
                else:
                    cold.append(seq)
        for group in _length_groups(cold):
            self._prefill_group(group)
        for hits in _length_groups(warm, key=lambda hit: len(hit[0].context()) - hit[1]):
            self._prefill_cached(hits)

    def _prefill_cached(self, hits: list[tuple[Sequence, int, list]]) -> None:
        """Prefill requests whose contexts start with cached KV: each computes the last S
        tokens of its context (S: the longest new part in the group; a row with a shorter new
        part recomputes a few cached tokens) over its cached KV, left-padded, so each row's
        real positions stay one contiguous suffix as the batch (and ``ragged.py``) needs."""
        S = max(len(seq.context()) - n for seq, n, _ in hits)
        short = [seq for seq, _, _ in hits if len(seq.context()) < S]
        if short:  # whole contexts shorter than another row's new part: no room to align
            self._prefill_group(short)
            hits = [hit for hit in hits if len(hit[0].context()) >= S]
        seqs = [seq for seq, _, _ in hits]
        contexts = [seq.context() for seq in seqs]
        used = [len(c) - S for c in contexts]  # cached tokens each row keeps (>= 0)
        G, P = len(hits), max(used)
        ids_GS = torch.tensor([c[len(c) - S :] for c in contexts], dtype=torch.long)
        mask_GT = torch.zeros((G, P + S), dtype=torch.long)
        for g, p in enumerate(used):
            mask_GT[g, P - p :] = 1
        pos_GS = torch.tensor(used, dtype=torch.long).unsqueeze(1) + torch.arange(S)
        cache = slab_cache()
        for layer, pairs in enumerate(zip(*(kv for _, _, kv in hits), strict=True)):
            k0, v0 = pairs[0]
            keys = k0.new_zeros((G, k0.shape[0], P, k0.shape[2]))
            values = v0.new_zeros((G, v0.shape[0], P, v0.shape[2]))
            for g, ((k, v), p) in enumerate(zip(pairs, used, strict=True)):
                if p:
                    keys[g, :, P - p :] = k[:, :p]
                    values[g, :, P - p :] = v[:, :p]
            cache.update(keys, values, layer)
        logits_GV = self._prefill_logits(ids_GS, mask_GT, pos_GS, cache)
        self._keep_routes(seqs, range(G), S, [len(c) - S for c in contexts], [S] * G)
        self._merge(seqs, cache, mask_GT)
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += G * S
        self.stats["prefix_hit_tokens"] += sum(used)
        self.stats["max_batch"] = max(self.stats["max_batch"], len(self.active))
        self._sample_and_finish(logits_GV, seqs)

    def _prefill_logits(self, ids, mask, positions, cache) -> torch.Tensor:
        """One prefill forward over ``cache`` (filled in place): the last position's logits."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw(self.model): cache},
        )
        return out.logits[:, -1, :]

    def _prefill_group(self, seqs: list[Sequence]) -> None:
        """Prefill prompts of similar length together; identical prompts (``n`` samples of
        one problem, a GRPO group) are run once and their KV rows repeated."""
        unique: dict[tuple[int, ...], int] = {}
        row_of = [unique.setdefault(tuple(s.context()), len(unique)) for s in seqs]
        prompts = list(unique)
        U, L = len(prompts), max(len(p) for p in prompts)
        ids_UL = torch.full((U, L), self.pad_id, dtype=torch.long)
        mask_UL = torch.zeros((U, L), dtype=torch.long)
        for u, prompt in enumerate(prompts):
            ids_UL[u, L - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask_UL[u, L - len(prompt) :] = 1
        pos_UL = (mask_UL.cumsum(1) - 1).clamp(min=0)
        cache = slab_cache()
        logits_GV = self._prefill_logits(ids_UL, mask_UL, pos_UL, cache)
        n_G = [len(s.context()) for s in seqs]
        self._keep_routes(seqs, row_of, L, [0] * len(seqs), n_G)
        mask_GL = mask_UL
        if U < len(seqs):
            rows_G = torch.tensor(row_of, dtype=torch.long)
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(0, rows_G)
                layer.values = layer.values.index_select(0, rows_G)
            logits_GV, mask_GL = logits_GV.index_select(0, rows_G), mask_UL.index_select(0, rows_G)
        self._merge(seqs, cache, mask_GL)
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += int(mask_UL.sum())
        self.stats["max_batch"] = max(self.stats["max_batch"], len(self.active))
        self._sample_and_finish(logits_GV, seqs)

    def _decode(self) -> None:
        B = len(self.active)
        ids_B1 = torch.tensor([[s.output_ids[-1]] for s in self.active], dtype=torch.long)
        pos_B1 = self.mask_BT.sum(1, keepdim=True)
        mask_BT = torch.cat([self.mask_BT, torch.ones((B, 1), dtype=torch.long)], dim=1)
        with ragged.using_plan(mask_BT):
            out = self.model(
                input_ids=ids_B1,
                attention_mask=mask_BT,
                position_ids=pos_B1,
                use_cache=True,
                **{cache_kw(self.model): self.cache},
            )
        self.mask_BT = mask_BT
        pos_B = [len(s.prompt_ids) + len(s.output_ids) - 1 for s in self.active]
        self._keep_routes(self.active, range(B), 1, pos_B, [1] * B)
        self.stats["decode_steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], B)
        self._sample_and_finish(out.logits[:, -1, :], self.active)

    def _keep_routes(self, seqs, rows, width: int, first_pos: list[int], n: list[int]) -> None:
        if self.routed_experts:  # the last forward's routes to the sequences that want them
            route_capture.keep(self.model, seqs, rows, width, first_pos, n)

    def _merge(self, seqs: list[Sequence], cache: Any, mask_GL: torch.Tensor) -> None:
        if not self.active:
            self.active, self.cache, self.mask_BT = list(seqs), cache, mask_GL
            return
        T, L = self.mask_BT.shape[1], mask_GL.shape[1]
        width = max(T, L)
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([left_pad(old.keys, width), left_pad(new.keys, width)], dim=0)
            old.values = torch.cat(
                [left_pad(old.values, width), left_pad(new.values, width)], dim=0
            )
        self.mask_BT = torch.cat([left_pad(self.mask_BT, width), left_pad(mask_GL, width)], dim=0)
        self.active.extend(seqs)
        # longest rows first, so rows with similar padding sit together (ragged.py); the
        # last G rows stay the new ones for sampling, which reads them by position
        order = torch.argsort(width - self.mask_BT.sum(1), stable=True)
        if not torch.equal(order, torch.arange(len(self.active))):
            self._reorder(order)

    def _sample_and_finish(self, logits_BV: torch.Tensor, rows: list[Sequence]) -> None:
        temps_B1 = torch.tensor([[s.params.temperature] for s in rows], dtype=torch.float32)
        logprobs_BV = sampling_logprobs(logits_BV, temps_B1)
        tokens_B = sample_tokens(logprobs_BV, [s.params for s in rows], [s.generator for s in rows])
        chosen_B = logprobs_BV.gather(1, tokens_B.unsqueeze(1)).squeeze(1)
        for seq, token, logprob in zip(rows, tokens_B.tolist(), chosen_B.tolist(), strict=True):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            self._check_finish(seq)
        self.stats["tokens"] += len(rows)
        done = [i for i, s in enumerate(self.active) if s.finish is not None]
        if done:
            for i in done:
                self._keep_prefix(i)
                self._resolve(self.active[i])
            keep = [i for i, s in enumerate(self.active) if s.finish is None]
            self._select(keep)

    def _keep_prefix(self, row: int) -> None:
        """Keep a finished row's KV for the next turn of its conversation: its prompt and
        output less the last token (sampled, never fed back)."""
        seq = self.active[row]
        if not self.prefix.max_bytes or seq.finish is None or seq.finish.type == "abort":
            return
        if seq.version_events:  # it ran across a weight swap (in place): part old-weight KV
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:-1]
        T, n = self.mask_BT.shape[1], int(self.mask_BT[row].sum())
        if n != len(tokens):  # not this row's whole context: keep nothing rather than guess
            return
        kv = [
            (layer.keys[row, :, T - n :].clone(), layer.values[row, :, T - n :].clone())
            for layer in self.cache.layers
        ]
        self.prefix.put(tuple(tokens), kv)

    def _check_finish(self, seq: Sequence) -> None:
        token = seq.output_ids[-1]
        if token in seq.stop_ids:
            seq.finish = FinishReason(type="stop", matched=token)
            return
        stops = seq.params.stop_strings()
        if stops:
            window = max(len(s) for s in stops) + 16
            tail = self.tokenizer.decode(seq.output_ids[-window:], skip_special_tokens=False)
            for stop in stops:
                if stop in tail:
                    seq.finish = FinishReason(type="stop", matched=stop)
                    return
        if len(seq.output_ids) >= seq.max_new:
            seq.finish = FinishReason(type="length", length=len(seq.output_ids))

    def _reorder(self, order: torch.Tensor) -> None:
        self.active = [self.active[i] for i in order.tolist()]
        self.mask_BT = self.mask_BT.index_select(0, order)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, order)
            layer.values = layer.values.index_select(0, order)

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self._reset_batch()
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.active = [self.active[i] for i in keep]
        mask_BT = self.mask_BT.index_select(0, index)
        first = int((mask_BT.sum(0) > 0).nonzero()[0])  # drop columns padded in every row
        self.mask_BT = mask_BT[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def _resolve(self, seq: Sequence) -> None:
        seq.weight_version = self.weight_version
        seq.version_events.append((self.weight_version, len(seq.output_ids)))
        if not seq.future.done():
            seq.future.set_result(seq)


PAD_WASTE = 0.25  # a prefill group pads at most this share of its real prompt tokens


def _length_groups(items: list, key=lambda seq: len(seq.context())) -> list[list]:
    """Split a prefill by the length it computes (``key``; a prompt's) so left-padding stays
    under ``PAD_WASTE``: one batch of an 86- and a 579-token prompt computes 1158 positions
    for 665 real ones."""
    groups: list[list] = []
    tokens = 0
    for seq in sorted(items, key=key):
        n = key(seq)
        if groups and (len(groups[-1]) + 1) * n <= (1 + PAD_WASTE) * (tokens + n):
            groups[-1].append(seq)
            tokens += n
        else:
            groups.append([seq])
            tokens = n
    return groups


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
