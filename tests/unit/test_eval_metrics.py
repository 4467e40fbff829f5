"""avg@k, unbiased pass@k (checked against enumeration), maj@k and the paired bootstrap."""

import itertools

import numpy as np
import pytest

from spade_async.eval.metrics import paired_bootstrap, pass_at_k, suite_metrics
from spade_async.eval.types import Sample


def _s(pid, k, score, extracted="x"):
    return Sample(id=pid, sample=k, prompt="", completion="", answer="", extracted=extracted,
                  score=score)  # fmt: skip


@pytest.mark.parametrize(("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 1, 5), (4, 4, 2)])
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_pass(n, c, k):
    flags = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    want = sum(any(flags[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(want, rel=0, abs=1e-12)


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="pass@3"):
        pass_at_k(2, 1, 3)


def test_suite_metrics_avg_pass_maj():
    samples = [_s("a", 0, 1.0, "5"), _s("a", 1, 0.0, "4"), _s("a", 2, 1.0, "5"),
               _s("b", 0, 0.0, "7"), _s("b", 1, 0.0, "7"), _s("b", 2, 1.0, "8")]  # fmt: skip
    m = suite_metrics(samples, k=3)
    assert m["avg@3"] == pytest.approx(3 / 6)
    assert m["pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert m["pass@3"] == 1.0
    assert m["maj@3"] == 0.5  # a: "5" wins (right); b: "7" wins (wrong)
    assert "maj@3" not in suite_metrics(samples, k=3, majority=False)


def test_paired_bootstrap():
    a = {str(i): float(i % 2) for i in range(40)}
    b = {str(i): 1.0 for i in range(40)}
    diff, lo, hi, n = paired_bootstrap(a, b, iters=2000)
    assert n == 40 and diff == 0.5 and lo <= diff <= hi and 0.2 < lo < hi < 0.8
    same = paired_bootstrap(a, a, iters=500)
    assert same[:3] == (0.0, 0.0, 0.0)
    # the interval narrows like 1/sqrt(n): 4x the problems, about half the width
    big_a = {str(i): float(i % 2) for i in range(160)}
    big_b = dict.fromkeys(big_a, 1.0)
    _, lo2, hi2, _ = paired_bootstrap(big_a, big_b, iters=2000)
    assert (hi2 - lo2) == pytest.approx((hi - lo) / 2, rel=0.35)
    with pytest.raises(ValueError, match="share no problem"):
        paired_bootstrap({"x": 1.0}, {"y": 1.0})
    assert np.isfinite(diff)
