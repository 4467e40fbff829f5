"""Tolerances that follow from the arithmetic, not from the machine the suite was written on.

A float32 result is compared with a float64 reference of the same computation, and the
allowed error is the rounding bound of that computation: ``EPS32 * sqrt(n)`` relative to the
size of what is summed, for each reduction of length n on the way (the probabilistic bound
of Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", 2019; the
worst case n * eps is never approached by blocked/pairwise sums). Every CPU kernel choice
(``ATEN_CPU_CAPABILITY=default``, ``avx2``, ``avx512``) changes the summation order, never
this bound.

For the trainer's policy gradient the long reductions are the softmax over the V-word
vocabulary (log-sum-exp: absolute log-prob error ~ EPS32 * sqrt(V)) and the sum over the T
loss tokens; hidden sizes of the tiny test models are far shorter.
"""

from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps


def reduction_bound(*lengths: int) -> float:
    """Relative float32 error of a chain of sums of these lengths: EPS32 * sum(sqrt(n))."""
    return EPS32 * sum(math.sqrt(max(n, 1)) for n in lengths)


def logit_bound(eps: float, zmax: float, *lengths: int) -> float:
    """Relative error of log-probs/entropies (and their gradients) computed from logits z that
    carry relative rounding ``eps`` (the compute dtype's): log-sum-exp and softmax turn a
    logit error d into an absolute error <= 2 d, and d <= eps * max|z|; the fp32 sums of the
    given lengths add ``reduction_bound``."""
    return eps * (1 + zmax) + reduction_bound(*lengths)


def assert_close_norm(got: torch.Tensor, ref64: torch.Tensor, rel: float, what: str) -> None:
    """||got - ref64|| <= rel * ||ref64|| (2-norms, in float64)."""
    err = (got.double() - ref64.double()).norm().item()
    scale = ref64.double().norm().item()
    assert err <= rel * scale, (
        f"{what}: ||got - ref64|| = {err:.3e} exceeds {rel:.2e} * ||ref64|| = {rel * scale:.3e}"
    )


def pointwise_bound(ops: int, expmax: float = 0.0, *lengths: int) -> float:
    """Relative float32 error of ``ops`` rounded elementwise operations, one of them an exp
    (or log-ratio) of an argument of size up to ``expmax`` (exp turns the argument's absolute
    rounding EPS32 * |x| into that relative error), followed by sums of the given lengths."""
    return EPS32 * (ops + expmax) + reduction_bound(*lengths)


def approx32(value: float, scale: float, rel: float):
    """pytest.approx for a float32 result whose float64 value is ``value``: absolute slack
    ``rel * scale``, where ``scale`` is the sum of the magnitudes of what was added up."""
    import pytest

    return pytest.approx(value, rel=0, abs=rel * scale)


def forward_bound(config, seq_len: int) -> float:
    """Relative float32 error of a decoder's logits / log-probs (same weights, any kernel
    order): every layer sums over the hidden size (q/k/v/o, up/gate), the head dim and the
    sequence (attention) and the intermediate size (down); then the head (hidden size) and
    the log-softmax (vocabulary)."""
    d, v = config.hidden_size, config.vocab_size
    inter, layers = config.intermediate_size, config.num_hidden_layers
    head = getattr(config, "head_dim", None) or d // config.num_attention_heads
    return reduction_bound(*([d, d, head, seq_len, d, d, inter] * layers), d, v)
