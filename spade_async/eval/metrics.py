"""Metrics over samples: avg@k, unbiased pass@k, maj@k, and a paired bootstrap interval."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from math import comb

import numpy as np

from spade_async.eval.types import Sample

__all__ = ["pass_at_k", "suite_metrics", "paired_bootstrap", "per_problem"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), exact integers."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def per_problem(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    by_id: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_id[s.id].append(s)
    return dict(by_id)


def _majority(group: list[Sample]) -> float:
    """Score of the most common extracted answer (ties: first seen); 0 if none extracted."""
    votes = Counter(s.extracted for s in group if s.extracted not in (None, ""))
    if not votes:
        return 0.0
    best = votes.most_common(1)[0][0]
    return next(s.score for s in group if s.extracted == best)


def suite_metrics(samples: Sequence[Sample], *, k: int, majority: bool = True) -> dict[str, float]:
    """avg@k = mean score over all samples; pass@k over problems (a sample passes when its
    score is 1.0); maj@k when answers are comparable strings."""
    groups = per_problem(samples)
    if not groups:
        return {}
    out = {f"avg@{k}": sum(s.score for s in samples) / len(samples)}
    ks = sorted({1, k})
    for kk in ks:
        out[f"pass@{kk}"] = sum(
            pass_at_k(len(g), sum(1 for s in g if s.score >= 1.0), kk) for g in groups.values()
        ) / len(groups)
    if majority and k > 1:
        out[f"maj@{k}"] = sum(_majority(g) for g in groups.values()) / len(groups)
    return out


def paired_bootstrap(
    a: dict[str, float], b: dict[str, float], *, iters: int = 10_000, seed: int = 0
) -> tuple[float, float, float, int]:
    """Difference mean(b) - mean(a) over problems both share, with a 95% percentile interval
    from resampling problems with replacement (paired: the same draw for both)."""
    ids = sorted(set(a) & set(b))
    if not ids:
        raise ValueError("the two results share no problem ids")
    diffs = [b[i] - a[i] for i in ids]
    d = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), size=(iters, len(d)))].mean(axis=1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(d.mean()), float(lo), float(hi), len(d)
