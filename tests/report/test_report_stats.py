"""Statistics of the CI report against the FACTS.md oracles and scipy (a test-only oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from tracelab.report.stats import (
    _u_distribution_counts,
    difference_of_medians,
    holm_adjust,
    mann_whitney_u,
    ratio_of_medians,
)

BASELINE = [100, 101, 99, 100, 102, 98, 100, 101, 99, 100]
CANDIDATE = [v * 1.05 for v in BASELINE]


def test_mann_whitney_oracle_from_facts() -> None:
    one = mann_whitney_u(CANDIDATE, BASELINE, alternative="greater")
    two = mann_whitney_u(CANDIDATE, BASELINE, alternative="two-sided")
    assert one.u == 100.0
    assert one.p_value == pytest.approx(7.97e-5, rel=1e-3)
    assert two.p_value == pytest.approx(1.593e-4, rel=1e-3)
    assert one.method == "asymptotic" and one.ties
    # The other direction: no evidence that the candidate is faster.
    assert mann_whitney_u(CANDIDATE, BASELINE, alternative="less").p_value > 0.99


def test_bootstrap_ci_oracle_from_facts() -> None:
    ci = ratio_of_medians(BASELINE, CANDIDATE, seed=0)
    assert ci.estimate == pytest.approx(1.05)
    assert ci.low == pytest.approx(1.040, abs=0.002)
    assert ci.high == pytest.approx(1.061, abs=0.002)
    assert ci.low <= ci.estimate <= ci.high


def test_bootstrap_is_reproducible_and_seed_dependent() -> None:
    rng = np.random.default_rng(7)
    b, c = rng.lognormal(4, 0.2, 40), rng.lognormal(4.05, 0.2, 40)
    assert ratio_of_medians(b, c, seed=3) == ratio_of_medians(b, c, seed=3)
    assert ratio_of_medians(b, c, seed=3).low != ratio_of_medians(b, c, seed=4).low


def test_difference_of_medians() -> None:
    ci = difference_of_medians([0.10, 0.11, 0.12, 0.10, 0.11], [0.15, 0.16, 0.14, 0.15, 0.17])
    assert ci.statistic == "difference"
    assert ci.estimate == pytest.approx(0.04)
    assert 0.0 < ci.low <= ci.estimate <= ci.high


def _cases() -> list[tuple[int, int, bool]]:
    return [
        (1, 1, False),
        (3, 5, False),
        (8, 8, False),
        (5, 20, False),
        (8, 300, False),
        (9, 9, False),
        (30, 25, False),
        (12, 12, True),
        (4, 6, True),
        (50, 60, True),
    ]


@pytest.mark.parametrize(("n1", "n2", "ties"), _cases())
@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_mann_whitney_matches_scipy(n1: int, n2: int, ties: bool, alternative: str) -> None:
    rng = np.random.default_rng(n1 * 1000 + n2)
    x, y = rng.normal(0.3, 1, n1), rng.normal(0, 1, n2)
    if ties:
        x, y = np.round(x * 2) / 2, np.round(y * 2) / 2
    ours = mann_whitney_u(x, y, alternative=alternative)  # type: ignore[arg-type]
    ref = mannwhitneyu(x, y, alternative=alternative)
    assert ours.u == pytest.approx(float(ref.statistic))
    assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(("n1", "n2"), [(10, 12), (20, 20), (8, 2000)])
def test_exact_method_matches_scipy_beyond_auto_range(n1: int, n2: int) -> None:
    rng = np.random.default_rng(n2)
    x, y = rng.normal(0.2, 1, n1), rng.normal(0, 1, n2)
    ours = mann_whitney_u(x, y, alternative="greater", method="exact")
    ref = mannwhitneyu(x, y, alternative="greater", method="exact")
    assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)


@pytest.mark.parametrize(("n1", "n2"), [(1, 1), (3, 4), (7, 7), (20, 45), (8, 3000)])
def test_exact_distribution_is_a_distribution(n1: int, n2: int) -> None:
    counts = [int(c) for c in _u_distribution_counts(n1, n2)]
    assert len(counts) == n1 * n2 + 1
    assert sum(counts) == math.comb(n1 + n2, n1)
    assert counts == counts[::-1]  # symmetric around n1*n2/2
    assert min(counts) >= 1


def test_exact_forbids_ties_and_bad_inputs() -> None:
    with pytest.raises(ValueError, match="ties"):
        mann_whitney_u([1, 2, 2], [2, 3], method="exact")
    with pytest.raises(ValueError, match="empty"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        ratio_of_medians([1.0, float("nan")], [1.0])
    with pytest.raises(ValueError, match="positive baseline"):
        ratio_of_medians([0.0, 0.0], [1.0])


def test_all_equal_values_give_no_evidence() -> None:
    assert mann_whitney_u([5.0] * 10, [5.0] * 10, alternative="greater").p_value == 1.0


def test_aa_false_positive_rate_and_gate() -> None:
    """A/A: samples from one distribution. The test alone flags about alpha of the pairs; the
    gate (significant AND above a 5% threshold) flags none."""
    rng = np.random.default_rng(11)
    significant = gated = 0
    trials = 400
    for _ in range(trials):
        a, b = rng.lognormal(4.6, 0.02, 20), rng.lognormal(4.6, 0.02, 20)
        p = mann_whitney_u(b, a, alternative="greater").p_value
        if p < 0.05:
            significant += 1
            if np.median(b) / np.median(a) > 1.05:
                gated += 1
    assert significant / trials < 0.09
    assert gated == 0


def test_bootstrap_ci_covers_the_true_ratio() -> None:
    """Coverage of the 95% interval on skewed (lognormal) samples with a true ratio of 1.1."""
    rng = np.random.default_rng(5)
    covered, trials = 0, 150
    for i in range(trials):
        b = rng.lognormal(0.0, 0.3, 40)
        c = rng.lognormal(math.log(1.1), 0.3, 40)
        ci = ratio_of_medians(b, c, resamples=1000, seed=i)
        covered += ci.low <= 1.1 <= ci.high
    assert 0.88 <= covered / trials <= 0.995


def test_holm_adjust() -> None:
    # Sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max.
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.9, 0.8]).tolist() == [1.0, 1.0]
    assert holm_adjust([]).size == 0
