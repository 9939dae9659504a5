"""Statistics for CI regression gates: bootstrap CI of a ratio of medians, Mann–Whitney U.

Why these two: step times of a training job are skewed (stalls, GC, data loading) and their
spread changes between runs, so a t-test on means misleads. The ratio of medians with a
bootstrap CI says *how much* slower; the Mann–Whitney U test says whether the difference is
beyond chance. A gate flags a regression only when both agree (see tracelab.report.compare).

Only numpy is used (scipy is a test-only oracle). The Mann–Whitney conventions follow
`scipy.stats.mannwhitneyu`: the statistic is U of the first sample; `method="auto"` is exact when
one sample has at most 8 values and there are no ties, otherwise the normal approximation with
tie correction and a 0.5 continuity correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Alternative = Literal["greater", "less", "two-sided"]
Method = Literal["auto", "exact", "asymptotic"]

#: Above this many bootstrap draws x sample values, draws are made in chunks (memory bound).
_BOOTSTRAP_CHUNK_VALUES = 4_000_000


@dataclass(frozen=True, kw_only=True)
class MannWhitneyResult:
    """Outcome of a Mann–Whitney U test of sample x against sample y."""

    #: U statistic of x: the number of (x_i, y_j) pairs with x_i > y_j, ties counting one half.
    u: float
    p_value: float
    alternative: Alternative
    #: "exact" or "asymptotic": which null distribution produced p_value.
    method: str
    #: True when some values are tied (the exact distribution then does not apply).
    ties: bool


@dataclass(frozen=True, kw_only=True)
class BootstrapCI:
    """A statistic of two medians with a percentile bootstrap confidence interval."""

    #: "ratio" (candidate / baseline) or "difference" (candidate - baseline).
    statistic: Literal["ratio", "difference"]
    #: The statistic on the observed samples.
    estimate: float
    low: float
    high: float
    confidence: float
    resamples: int
    seed: int


def _as_sample(values: npt.ArrayLike, what: str) -> npt.NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{what} is empty: a statistic needs at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} holds NaN or infinite values; drop them before testing")
    return arr


def _midranks(combined: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], float]:
    """Ranks 1..n with ties given their average rank, and the tie term sum(t^3 - t)."""
    _, inverse, counts = np.unique(combined, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid = ends - (counts - 1) / 2.0
    t = counts.astype(np.float64)
    return mid[inverse], float(np.sum(t**3 - t))


def _u_distribution_counts(n1: int, n2: int) -> npt.NDArray[Any]:
    """Number of orderings giving each U = 0..n1*n2 under H0 (exact integers).

    These are the coefficients of the Gaussian binomial [n1+n2 choose k]_q, built as
    prod_{i=1..k} (1 - q^(m+i)) / (1 - q^i) with k = min(n1, n2), m = max(n1, n2). Every
    partial product is itself a Gaussian binomial, so all intermediate values are exact
    non-negative integers. int64 when C(n1+n2, k) fits, Python ints otherwise.
    """
    k, m = min(n1, n2), max(n1, n2)
    dtype: type = np.int64 if math.comb(n1 + n2, k) < 2**61 else object
    size = k * m + 1
    poly: npt.NDArray[Any] = np.zeros(size, dtype=dtype)
    poly[0] = 1
    for i in range(1, k + 1):
        shift = m + i
        if shift < size:  # multiply by (1 - q^shift), truncated: the true degree stays < size
            poly[shift:] = poly[shift:] - poly[:-shift].copy()
        for r in range(i):  # divide by (1 - q^i): a running sum along each residue class
            poly[r::i] = np.cumsum(poly[r::i])
    return poly


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    alternative: Alternative = "two-sided",
    method: Method = "auto",
) -> MannWhitneyResult:
    """Mann–Whitney U test; alternative="greater" asks whether x tends to exceed y.

    For a step-time gate, x is the candidate and y the baseline: a small one-sided p says the
    candidate's steps are slower than chance explains.
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(
            f"alternative must be 'greater', 'less' or 'two-sided', not {alternative!r}"
        )
    xs, ys = _as_sample(x, "x"), _as_sample(y, "y")
    n1, n2 = xs.size, ys.size
    ranks, tie_term = _midranks(np.concatenate([xs, ys]))
    u1 = float(np.sum(ranks[:n1]) - n1 * (n1 + 1) / 2.0)
    u2 = n1 * n2 - u1
    ties = tie_term > 0
    if method == "auto":
        method = "exact" if (min(n1, n2) <= 8 and not ties) else "asymptotic"
    if alternative == "greater":
        u = u1
    elif alternative == "less":
        u = u2
    else:
        u = max(u1, u2)

    if method == "exact":
        if ties:
            raise ValueError(
                "the exact Mann–Whitney distribution assumes no ties; use 'asymptotic'"
            )
        counts = _u_distribution_counts(n1, n2)
        total = math.comb(n1 + n2, n1)
        upper = int(sum(int(c) for c in counts[int(round(u)) :]))  # P(U >= u) numerator
        p = upper / total
    elif method == "asymptotic":
        n = n1 + n2
        mu = n1 * n2 / 2.0
        var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
        if var <= 0:  # every value equal: the data say nothing about a shift
            return MannWhitneyResult(
                u=u1, p_value=1.0, alternative=alternative, method="asymptotic", ties=ties
            )
        p = _normal_sf((u - mu - 0.5) / math.sqrt(var))
    else:
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', not {method!r}")
    if alternative == "two-sided":
        p *= 2.0
    return MannWhitneyResult(
        u=u1, p_value=min(max(p, 0.0), 1.0), alternative=alternative, method=method, ties=ties
    )


def _bootstrap_medians(
    sample: npt.NDArray[np.float64], resamples: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Medians of `resamples` resamples (with replacement) of `sample`, drawn in chunks."""
    n = sample.size
    chunk = max(1, _BOOTSTRAP_CHUNK_VALUES // n)
    out = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(sample[idx], axis=1)
    return out


def _median_ci(
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    statistic: Literal["ratio", "difference"],
    confidence: float,
    resamples: int,
    seed: int,
) -> BootstrapCI:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100 for a usable interval, not {resamples}")
    base, cand = _as_sample(baseline, "baseline"), _as_sample(candidate, "candidate")
    base_median, cand_median = float(np.median(base)), float(np.median(cand))
    if statistic == "ratio" and base_median <= 0:
        raise ValueError(f"the baseline median is {base_median}; a ratio needs a positive baseline")
    rng = np.random.default_rng(seed)
    base_meds = _bootstrap_medians(base, resamples, rng)
    cand_meds = _bootstrap_medians(cand, resamples, rng)
    if statistic == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            draws = cand_meds / base_meds
        estimate = cand_median / base_median
    else:
        draws = cand_meds - base_meds
        estimate = cand_median - base_median
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return BootstrapCI(
        statistic=statistic,
        estimate=estimate,
        low=float(low),
        high=float(high),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def ratio_of_medians(
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> BootstrapCI:
    """median(candidate) / median(baseline) with a percentile bootstrap CI.

    Each side is resampled independently (the runs are independent), and the same seed gives
    the same interval, so a CI report is reproducible.
    """
    return _median_ci(baseline, candidate, "ratio", confidence, resamples, seed)


def difference_of_medians(
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> BootstrapCI:
    """median(candidate) - median(baseline) with a percentile bootstrap CI (for shares)."""
    return _median_ci(baseline, candidate, "difference", confidence, resamples, seed)


def holm_adjust(p_values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Holm–Bonferroni adjusted p-values, in the input order.

    A report judges several metrics at once; comparing each adjusted p with alpha keeps the
    chance of flagging *any* metric of an unchanged run at alpha or less (family-wise), where
    raw p-values would flag one of five noisy metrics far more often.
    """
    p = np.asarray(p_values, dtype=np.float64).ravel()
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted
