"""The what-if replay's variants (every rank at the median, each rank alone at the median) give
the same numbers as walking all of them at once, the way the replay did before it was made
linear in ranks (issue 22: 9, 29 and 113 MB held at 128, 256 and 512 ranks)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tracelab.analyzers import _replay


def _all_variants_at_once(start, gaps, part, med, tail, med_tail, transfer):
    """The replay as it was: (ranks + 2) variants x matches x ranks walked together."""
    n = len(start)
    nv = 2 + n
    g = np.repeat(gaps[None], nv, axis=0)
    tl = np.repeat(tail[None], nv, axis=0)
    g[1] = np.where(part, med[:, None], np.nan)
    tl[1] = med_tail
    for i in range(n):
        g[2 + i][:, i] = np.where(part[:, i], med, np.nan)
        tl[2 + i][i] = med_tail
    t = _replay._walk(np.tile(start, (nv, 1)), g, part, transfer)
    total = (t + tl).max(axis=1) - start.min()
    return float(total[0]), float(total[1]), total[2:]


def _case(rng, ranks, matches, partial):
    # ns counts and their halves, as the replay sees them (exact in a double).
    start = rng.integers(0, 5_000, ranks).astype(np.float64)
    gaps = rng.integers(0, 2_000_000, (matches, ranks)).astype(np.float64) / 2
    part = np.ones((matches, ranks), dtype=bool)
    if partial:
        for k in range(matches):
            if rng.random() < 0.5:
                part[k] = rng.random(ranks) < 0.5
                part[k, rng.integers(0, ranks)] = True
    gaps[~part] = np.nan
    med = np.nanmedian(gaps, axis=1)
    tail = rng.integers(0, 100_000, ranks).astype(np.float64)
    transfer = rng.integers(0, 50_000, matches).astype(np.float64)
    return start, gaps, part, med, tail, float(np.median(tail)), transfer


@pytest.mark.parametrize("partial", [False, True], ids=["every-rank", "sub-groups"])
@pytest.mark.parametrize("ranks,matches", [(1, 1), (2, 1), (3, 7), (16, 5), (70, 40)])
def test_same_numbers_as_walking_every_variant_at_once(ranks, matches, partial):
    rng = np.random.default_rng(ranks * 1000 + matches + partial)
    for _ in range(5):
        case = _case(rng, ranks, matches, partial)
        actual, ideal, alone = _replay._replay(*case)
        want = _all_variants_at_once(*case)
        assert (actual, ideal) == want[:2]
        assert alone.tolist() == want[2].tolist()


def test_a_tie_for_the_slowest_rank_saves_nothing_alone():
    """Two ranks equally late: speeding up either alone leaves the other one last."""
    start = np.zeros(4)
    gaps = np.array([[10.0, 10.0, 90.0, 90.0]])
    med = np.nanmedian(gaps, axis=1)
    tail = np.zeros(4)
    actual, ideal, alone = _replay._replay(
        start, gaps, np.ones_like(gaps, bool), med, tail, 0.0, np.array([5.0])
    )
    assert actual == 95.0 and ideal == 55.0
    assert alone.tolist() == [95.0, 95.0, 95.0, 95.0]


def test_memory_grows_linearly_in_ranks():
    """Peak memory of one step's replay, every collective spanning every rank: doubling the
    ranks about doubles it (it grew 4x before: the variants were ranks x matches x ranks)."""
    peaks = []
    for ranks in (512, 1024):
        case = _case(np.random.default_rng(ranks), ranks, 50, partial=False)
        tracemalloc.start()
        _replay._replay(*case)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 2.5 * peaks[0]
    assert peaks[1] < 8 * 50 * 1024 * 8  # a few copies of the matches x ranks gaps, no more
