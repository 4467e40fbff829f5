"""``decode_sglang`` in one pass over a whole response (one base64 decode straight from the
text, one bounds check, one cast) gives the bytes the per-id decoder gave and refuses the
same inputs with the same one-line errors."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import pytest

from spade_async.generation.routed_experts import (
    RouteError,
    RouteShape,
    decode_sglang,
    encode_sglang,
)


def _reference(text: str, shape: RouteShape, expected_rows: int) -> bytes:
    """The decoder as it was (b64decode with validate, np.where for -1)."""
    try:
        raw = base64.b64decode(text, validate=True)
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
    if ids.size and (int(ids.min()) < -1 or int(ids.max()) >= shape.experts):
        bad = int(ids.min()) if int(ids.min()) < -1 else int(ids.max())
        raise RouteError(f"routed_experts holds expert id {bad}, outside [0, {shape.experts})")
    return np.where(ids < 0, shape.unset, ids).astype(shape.dtype).tobytes()


SHAPES = [RouteShape(layers=48, topk=8, experts=128), RouteShape(layers=3, topk=2, experts=255),
          RouteShape(layers=4, topk=4, experts=512)]  # uint8, uint8 at its edge, int16  # fmt: skip


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except RouteError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [0, 1, 7])
def test_equals_the_per_id_decoder(shape, rows):
    rng = np.random.default_rng(rows + shape.experts)
    for unset_share in (0.0, 0.3, 1.0):  # no -1, some, every id -1
        ids = rng.integers(0, shape.experts, size=(rows, shape.layers, shape.topk))
        ids[rng.random(ids.shape) < unset_share] = -1
        ids.flat[:1] = shape.experts - 1 if ids.size and unset_share < 1 else ids.flat[:1]
        text = encode_sglang(ids)
        got = decode_sglang(text, shape, rows)
        assert got == _reference(text, shape, rows)
        back = np.frombuffer(got, dtype=shape.dtype).reshape(ids.shape)
        assert ((back == shape.unset) == (ids == -1)).all()
        assert (back[ids >= 0] == ids[ids >= 0]).all()


def _bad_inputs(shape: RouteShape) -> list[tuple[str, int]]:
    ok = np.zeros((2, shape.layers, shape.topk), dtype=np.int64)
    text = encode_sglang(ok)
    out = [(text, 3), (text[:-4], 2), (text + "A", 2), ("not base64!", 2), (text + "\n", 2),
           ("=" + text[1:], 2), (text.replace("A", "é", 1), 2), ("", 1)]  # fmt: skip
    for bad in (-2, -(2**31), shape.experts, shape.experts + 1, 2**31 - 1):
        ids = ok.copy()
        ids[1, -1, -1] = bad
        out.append((encode_sglang(ids), 2))
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_refuses_what_the_per_id_decoder_refuses(shape):
    for text, rows in _bad_inputs(shape):
        new, old = (
            _outcome(decode_sglang, text, shape, rows),
            _outcome(_reference, text, shape, rows),
        )
        assert new == old, (text[:40], rows)
        assert new[0] == "error" or text == ""
