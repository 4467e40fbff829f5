"""MoE routes on the wire and in a sample: what rollout routing replay (R3) carries.

SGLang 0.5.23 (``--enable-return-routed-experts``; a request's ``return_routed_experts`` and
``routed_experts_start_len``) returns ``meta_info["routed_experts"]``: base64 of the
flattened int32 top-k expert ids, ``[rows, layers, top_k]`` row-major
(``state_capturer/routed_experts.py`` captures int32 ids per token and layer,
``managers/detokenizer_manager.py`` base64-encodes ``tensor.numpy().tobytes()``). The rows
are the positions ``[start_len, seqlen - 1)`` of prompt + output (the last sampled token
never ran through the model): ``seqlen - 1 - start_len`` of them
(``scheduler_components/batch_result_processor.py``). The scheduler refuses a start length
below 0 or above the prompt's length (``managers/scheduler.py``). The CPU engine
(``engine.py``, ``route_capture.py``) writes the same bytes.

A sample keeps its routes compact (``RouteShape.dtype``: uint8 below 256 experts, else
int16): row ``p`` is the route of token ``p`` of the sample. The dtype's largest value
(``RouteShape.unset``) stands for SGLang's ``-1`` (its capturer pads ids with -1, e.g. the
fused shared-expert columns in ``state_capturer/routed_experts.py``): those ids' layers
route freely in the trainer (``trainer/route_sanity.py``), the rest of the sample
still replays. Tokens past the last row (a
template's closing tokens after the last turn) route freely: no trained token depends on
them (``check_sample``). ``tests/contract`` checks the field names, types and rules above
against the pinned wheel.

Legend: R route rows (positions), L MoE layers, K experts per token (top-k).
"""

from __future__ import annotations

import base64
import binascii

import msgspec
import numpy as np

__all__ = [
    "RouteShape", "RouteError", "route_shape", "decode_sglang", "encode_sglang", "rows",
    "check_sample", "route_shape_of",
]  # fmt: skip


class RouteError(ValueError):
    """Routes that do not fit the sample or the model (one line: what is wrong)."""


class RouteShape(msgspec.Struct, frozen=True, kw_only=True):
    layers: int  # MoE layers (every decoder layer of a Qwen3-MoE)
    topk: int  # experts per token
    experts: int  # experts per layer (ids are 0..experts-1)

    @property
    def dtype(self) -> np.dtype:
        """How a sample stores one expert id (the plan counts these bytes); its largest value
        is reserved for ``unset``."""
        return np.dtype(np.uint8) if self.experts < 256 else np.dtype("<i2")

    @property
    def unset(self) -> int:
        """The stored id of SGLang's ``-1`` (no route recorded for that token)."""
        return int(np.iinfo(self.dtype).max)

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's routes in a sample: layers x top-k x the id's size."""
        return self.layers * self.topk * self.dtype.itemsize


def route_shape(config) -> RouteShape | None:
    """The routes of an HF config (object or dict); None for a dense model."""
    raw = config if isinstance(config, dict) else config.to_dict()
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    topk = int(raw.get("num_experts_per_tok") or 0)
    if not experts or not topk:
        return None
    return RouteShape(layers=int(raw["num_hidden_layers"]), topk=topk, experts=experts)


def route_shape_of(model_dir) -> RouteShape | None:
    """The routes of a model directory's config.json, else of the planner's built-in shape
    of that name (a dry run before the weights are downloaded); None: dense or unknown."""
    import json
    from pathlib import Path

    config = Path(str(model_dir)).expanduser() / "config.json"
    if config.is_file():
        return route_shape(json.loads(config.read_text()))
    from spade_async.plan.shapes import model_shape

    shape = model_shape(model_dir)
    if shape is None or not shape.experts:
        return None
    return RouteShape(layers=shape.layers, topk=shape.experts_per_tok, experts=shape.experts)


def decode_sglang(text: str, shape: RouteShape, expected_rows: int) -> bytes:
    """``meta_info["routed_experts"]`` -> a sample's compact bytes; RouteError when its size
    is not ``expected_rows`` x layers x top-k int32 or an id is outside [0, experts)."""
    try:  # b64decode(text, validate=True) without its copy of the text to bytes
        raw = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise RouteError(f"routed_experts is not base64 ({exc})") from None
    per_row = shape.layers * shape.topk * 4
    if len(raw) % per_row:
        raise RouteError(
            f"routed_experts has {len(raw)} bytes, not a whole number of rows of "
            f"{shape.layers} layers x top-{shape.topk} int32 ({per_row} bytes)"
        )
    got = len(raw) // per_row
    if got != expected_rows:
        raise RouteError(f"routed_experts has {got} token rows, expected {expected_rows}")
    ids = np.frombuffer(raw, dtype="<i4")
    lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
    if lo < -1 or hi >= shape.experts:
        bad = lo if lo < -1 else hi
        raise RouteError(f"routed_experts holds expert id {bad}, outside [0, {shape.experts})")
    # one cast for the whole response: ids in [-1, experts) fit the dtype, and -1 becomes
    # uint8's 255, its unset; int16 keeps -1, which is set to its unset after
    out = ids.astype(shape.dtype)
    if lo < 0 and shape.dtype.kind != "u":
        out[out == -1] = shape.unset
    return out.tobytes()


def encode_sglang(ids_RLK) -> str:
    """SGLang's wire form of ``[rows, layers, top_k]`` ids (the CPU engine's reply)."""
    return base64.b64encode(np.ascontiguousarray(ids_RLK, dtype="<i4").tobytes()).decode()


def rows(data: bytes, shape: RouteShape) -> int:
    """Route rows in a sample's compact bytes; RouteError when not whole rows."""
    if len(data) % shape.row_bytes:
        raise RouteError(
            f"{len(data)} route bytes are not whole rows of {shape.row_bytes} "
            f"({shape.layers} layers x top-{shape.topk})"
        )
    return len(data) // shape.row_bytes


def check_sample(data: bytes, shape: RouteShape, n_tokens: int, loss_mask) -> None:
    """RouteError unless ``data`` covers every position a trained token depends on: rows
    ``0 .. last trained index - 1`` (at most ``n_tokens`` rows), ids in range or unset.
    The trainer calls it per sample (``trainer/route_sanity.py``): a short sample (a later
    turn came back without routes) replays the rows it has and is counted as partial."""
    n = rows(data, shape)
    last = max((i for i, m in enumerate(loss_mask) if m), default=0)
    if n > n_tokens or n < last:
        raise RouteError(
            f"routes cover {n} tokens; the sample has {n_tokens} and trains up to token {last}"
        )
    ids = np.frombuffer(data, dtype=shape.dtype)
    bad = ids[(ids >= shape.experts) & (ids != shape.unset)]
    if bad.size:
        raise RouteError(f"routes hold expert id {int(bad[0])}, outside [0, {shape.experts})")
