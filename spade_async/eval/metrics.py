"""Metrics over samples: avg@k, unbiased pass@k, maj@k, and a paired bootstrap interval."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from math import comb
from typing import Any

import numpy as np

from spade_async.eval.types import Sample

__all__ = [
    "pass_at_k",
    "suite_metrics",
    "paired_bootstrap",
    "per_problem",
    "Column",
    "column",
    "column_value",
    "bootstrap",
    "PAPER_COLUMNS",
    "COMPOSITE",
]


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
    """Score of the most common extracted answer; 0 if none extracted. A tie goes to the
    answer of the lowest sample index (not to whichever finished first: the same samples
    give the same maj@k in any order)."""
    group = sorted(group, key=lambda s: s.sample)
    votes = Counter(s.extracted for s in group if s.extracted not in (None, ""))
    if not votes:
        return 0.0
    top = max(votes.values())
    best = next(s.extracted for s in group if votes.get(s.extracted) == top)
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


# --- table columns, the paper's composite, bootstrap clustered by task -------------------

# The paper's eight held-out columns (reference ``eval_offline/table_mapping.py``
# RQ1_COLUMNS; "+5.3 average over 8 benchmarks" is their mean) and the two tool-use ones.
PAPER_COLUMNS: dict[str, str] = {
    "AIME-25": "aime25", "AIME-26": "aime26", "GPQA-Diamond": "gpqa_diamond",
    "LiveCodeBench": "livecodebench", "RG:Math": "rg_math", "RG:Algorithmic": "rg_algorithmic",
    "RG:Cognition": "rg_cognition", "RG:Logic": "rg_logic",
    "BFCL-v4": "bfcl_v4", "ACEBench-A": "acebench_agent",
}  # fmt: skip
COMPOSITE = list(PAPER_COLUMNS)[:8]  # the "average over 8 benchmarks"


class Column:
    """One suite's table value as a function of resampled clusters.

    ``strata`` -> ``cluster`` -> (score sum, samples). A cluster is what is independent: a
    problem, but for reasoning-gym a *task* (its 8 episodes share a generator and a
    difficulty, so they are not 8 independent draws). Strata are sub-benchmarks resampled
    separately whose accuracies the suite combines: BFCL's categories (BFCL's overall),
    ACEBench's multi_step and multi_turn (the Agent metric's 50/50)."""

    def __init__(self, suite: str, samples: Sequence[Sample], sizes: dict[str, int] | None = None):
        self.suite, self.sizes = suite, dict(sizes or {})
        self.strata: dict[str, dict[str, list[float]]] = {}
        self.content: dict[str, tuple[str, str]] = {}
        for s in samples:
            stratum, cluster = _stratum(suite, s.id), _cluster(suite, s.id)
            cell = self.strata.setdefault(stratum, {}).setdefault(cluster, [0.0, 0])
            cell[0] += s.score
            cell[1] += 1
            self.content.setdefault(s.id, (s.prompt, s.answer))
        self.metric = {"bfcl_v4": "overall", "bfcl_v4_multi_turn": "multi_turn",
                       "acebench_agent": "agent"}.get(suite, "avg")  # fmt: skip

    def combine(self, acc: dict[str, Any], count: dict[str, int]) -> Any:
        """The suite's value from per-stratum accuracies (floats or bootstrap arrays)."""
        if self.suite.startswith("bfcl_v4"):
            from spade_async.eval.suites.bfcl_lib import aggregate

            return aggregate(acc, count, self.sizes)[self.metric]
        if self.suite == "acebench_agent" or len(acc) > 1:
            return sum(acc.values()) / len(acc)  # ACEBench Agent: the two halves, 50/50
        return next(iter(acc.values()))


def _stratum(suite: str, sample_id: str) -> str:
    if suite.startswith("bfcl_v4"):
        return sample_id.rsplit("_", 1)[0]
    if suite == "acebench_agent":
        return "multi_turn" if "multi_turn" in sample_id else "multi_step"
    return ""


def _cluster(suite: str, sample_id: str) -> str:
    return sample_id.split("/", 1)[0] if suite.startswith("rg_") else sample_id


def column(suite: str, samples: Sequence[Sample], sizes: dict[str, int] | None = None) -> Column:
    return Column(suite, samples, sizes)


def column_value(col: Column) -> float:
    acc = {k: sum(c[0] for c in v.values()) / sum(c[1] for c in v.values())
           for k, v in col.strata.items()}  # fmt: skip
    return float(col.combine(acc, {k: len(v) for k, v in col.strata.items()}))


def _check_pairs(a: Column, b: Column) -> None:
    for pid in sorted(set(a.content) & set(b.content)):
        for field, x, y in zip(("prompt", "answer"), a.content[pid], b.content[pid], strict=True):
            if x != y:
                raise ValueError(
                    f"suite {a.suite}: problem {pid!r} has a different {field} in the two "
                    f"runs: they did not evaluate the same problem (compare runs of one data set)"
                )


def bootstrap(
    columns: dict[str, tuple[Column, Column | None]],
    composite: Sequence[str] = (),
    *,
    iters: int = 10_000,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Each column's value (or, given two runs, B - A) with a 95% percentile interval, and
    the mean of ``composite`` columns as ``"composite"``. Clusters are drawn with
    replacement within each stratum; with two runs the same draw serves both (paired, on
    clusters both share, whose problems must match in content). Columns draw independently
    of each other (different problems), all in the same iteration, so the composite's
    interval comes from the joint draw."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    draws: dict[str, np.ndarray] = {}
    for name, (a, b) in columns.items():
        if b is not None:
            _check_pairs(a, b)
        acc_a: dict[str, np.ndarray] = {}
        acc_b: dict[str, np.ndarray] = {}
        count: dict[str, int] = {}
        shared = 0
        for stratum, cells_a in a.strata.items():
            keys = sorted(cells_a if b is None else set(cells_a) & set(b.strata.get(stratum, {})))
            if not keys:
                continue
            shared += len(keys)
            idx = rng.integers(0, len(keys), size=(iters, len(keys)))
            for acc, cells in ((acc_a, cells_a), (acc_b, None if b is None else b.strata[stratum])):
                if cells is None:
                    continue
                sums = np.asarray([cells[k][0] for k in keys], dtype=np.float64)
                ns = np.asarray([cells[k][1] for k in keys], dtype=np.float64)
                acc[stratum] = sums[idx].sum(axis=1) / ns[idx].sum(axis=1)
            count[stratum] = len(keys)
        if not count:
            raise ValueError(f"suite {a.suite}: the two runs share no problem")
        va = a.combine(acc_a, count)
        boots = va if b is None else b.combine(acc_b, count) - va
        draws[name] = np.asarray(boots, dtype=np.float64)
        if b is None:
            point = column_value(a)
        else:
            point = column_value(_restrict(b, a)) - column_value(_restrict(a, b))
        lo, hi = np.quantile(draws[name], [0.025, 0.975])
        out[name] = {"value": point, "ci95": [float(lo), float(hi)], "clusters": shared,
                     "metric": a.metric}  # fmt: skip
        if b is not None:
            out[name] |= {"a": column_value(_restrict(a, b)), "b": column_value(_restrict(b, a)),
                          "unpaired": len(set(a.content) ^ set(b.content))}  # fmt: skip
    if composite and all(c in out for c in composite):
        mean = np.mean([draws[c] for c in composite], axis=0)
        lo, hi = np.quantile(mean, [0.025, 0.975])
        out["composite"] = {"value": float(np.mean([out[c]["value"] for c in composite])),
                            "ci95": [float(lo), float(hi)], "columns": list(composite),
                            "metric": f"mean of {len(composite)}"}  # fmt: skip
    return out


def _restrict(col: Column, other: Column) -> Column:
    """``col`` on the clusters ``other`` shares (the paired subset)."""
    out = Column.__new__(Column)
    out.suite, out.sizes, out.metric, out.content = col.suite, col.sizes, col.metric, col.content
    out.strata = {
        st: {k: v for k, v in cells.items() if k in other.strata.get(st, {})}
        for st, cells in col.strata.items()
    }
    out.strata = {st: cells for st, cells in out.strata.items() if cells}
    return out
