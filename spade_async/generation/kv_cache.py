"""The CPU engine's KV-cache helpers: a ``DynamicCache`` whose layers grow in place
(``slab_cache``), left-padding for merging rows of different lengths, the name
transformers gives the cache argument, and finished requests' KV kept for the next turn of
their conversation (``PrefixCache``)."""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["PrefixCache", "cache_kw", "left_pad", "slab_cache"]


def slab_cache() -> Any:
    """A ``DynamicCache`` whose layers grow in place (see ``_slab_layer``)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _slab_layer()
    return cache


_SLAB: type | None = None


def _slab_layer() -> type:
    """``DynamicLayer`` whose keys/values are views into buffers with spare room along T.

    transformers' ``DynamicLayer.update`` concatenates, copying the whole cache of every
    layer at every decode step: at batch 30 that was a third of the step on a CPU. Here a
    step writes its column in place; the buffer grows by half when full. Any other code that
    assigns ``keys``/``values`` (the engine's merge and row selection) just leaves tensors
    that are not views of the buffer: the next update copies them into a new one.
    """
    global _SLAB
    if _SLAB is not None:
        return _SLAB
    from transformers.cache_utils import DynamicLayer

    class SlabLayer(DynamicLayer):
        k_buf: torch.Tensor | None = None
        v_buf: torch.Tensor | None = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
            n, t = self.keys.shape[-2], key_states.shape[-2]
            own = (  # still a view of the buffer (``_base`` is unset under inference_mode)
                self.k_buf is not None
                and self.keys.data_ptr() == self.k_buf.data_ptr()
                and self.keys.stride() == self.k_buf.stride()
                and self.values.data_ptr() == self.v_buf.data_ptr()
            )
            if not own or n + t > self.k_buf.shape[-2]:
                self.k_buf = _with_room(self.keys, n + t)
                self.v_buf = _with_room(self.values, n + t)
            self.k_buf[:, :, n : n + t] = key_states
            self.v_buf[:, :, n : n + t] = value_states
            self.keys, self.values = self.k_buf[:, :, : n + t], self.v_buf[:, :, : n + t]
            return self.keys, self.values

    _SLAB = SlabLayer
    return SlabLayer


def _with_room(x: torch.Tensor, need: int) -> torch.Tensor:
    """A ``[B, H, cap, D]`` buffer holding ``x`` in its first columns, ``cap >= need`` with
    room for a run of decode steps."""
    B, H, n, D = x.shape
    buf = x.new_empty((B, H, need + max(32, need // 2), D))
    buf[:, :, :n] = x
    return buf


def cache_kw(model: Any) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; older 5.x ``past_key_values``."""
    kw = getattr(model, "_spadecache_kw", None)
    if kw is None:
        kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        model._spadecache_kw = kw
    return kw


def left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad dim 2 (KV ``[B,H,T,D]``) or dim 1 (mask ``[B,T]``) on the left with zeros."""
    dim = 2 if x.dim() == 4 else 1
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class PrefixCache:
    """Finished requests' KV rows, for a later request whose context starts with one of them:
    a multi-turn conversation's next turn (its prompt is the last turn's prompt and reply,
    then the new observation: ``chat.py`` keeps token lists append-only) prefills only the
    new tokens. SGLang's radix cache does this on a GPU; this is the same reuse reduced to
    whole-request entries, least recently used dropped first past ``max_bytes``.

    An entry is the KV of ``tokens`` (a finished request's prompt and output less its last
    token, which no forward pass has seen), per layer ``[H, n, D]``. The owner (the engine's
    scheduler thread) drops everything whenever the weights change: KV computed under other
    weights is never reused. Legend: n cached tokens, H kv heads, D head dim.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            OrderedDict()
        )
        self._lengths: dict[int, int] = {}  # entry length -> entries of that length
        self.stats = {"hits": 0, "hit_tokens": 0, "misses": 0, "evictions": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: tuple[int, ...], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if not tokens or size > self.max_bytes:
            return
        if tokens in self._entries:
            self._drop(tokens)
        self._entries[tokens] = kv
        self._lengths[len(tokens)] = self._lengths.get(len(tokens), 0) + 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats["evictions"] += 1

    def longest(
        self, context: list[int]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest entry that is a prefix of ``context`` and leaves at least one token of
        it to compute (its logits draw the first new token): ``(n, kv)``, or ``(0, None)``."""
        for n in sorted(self._lengths, reverse=True):
            if n >= len(context):
                continue
            key = tuple(context[:n])
            kv = self._entries.get(key)
            if kv is not None:
                self._entries.move_to_end(key)
                self.stats["hits"] += 1
                self.stats["hit_tokens"] += n
                return n, kv
        self.stats["misses"] += 1
        return 0, None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        kv = self._entries.pop(key)
        self.bytes -= sum(k.nbytes + v.nbytes for k, v in kv)
        left = self._lengths[len(key)] - 1
        if left:
            self._lengths[len(key)] = left
        else:
            del self._lengths[len(key)]
