"""The scheduler thread's own half of the CPU engine: the running batch and the work on it.

``Engine`` (engine.py) keeps the state other threads touch under its lock (the waiting
queue, pause/abort/retract flags, a pending weight swap, released memory) and the public,
thread-safe calls. What is here is touched only by the scheduler thread, with no lock:
the running rows (``active``), their KV cache (``cache``, ``[B, H, T, D]``) and attention
mask (``mask_BT``), the prefix cache of finished requests, the step counters, and the
prefill, decode, sampling and row bookkeeping that move them.

Legend: B running rows, G rows being prefilled, T cached positions, L prompt length,
V vocab, H kv heads, D head dim, S new (uncached) tokens of a prefix-cache hit, U unique
prompts of a prefill group (identical prompts prefilled once), P cached positions kept by
a prefix-cache hit.
"""

from __future__ import annotations

from typing import Any

import torch

from spade_async.generation import ragged, route_capture
from spade_async.generation.engine_types import Sequence
from spade_async.generation.kv_cache import cache_kw, left_pad, slab_cache
from spade_async.generation.logprob_convention import sampling_logprobs
from spade_async.generation.protocol import FinishReason
from spade_async.generation.sampling import sample_tokens

__all__ = ["BatchWork", "PAD_WASTE"]


class BatchWork:
    """Mixin of ``Engine``: every method here runs on the scheduler thread only."""

    active: list[Sequence]
    cache: Any
    mask_BT: torch.Tensor | None

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
