"""The what-if replay's variants (every rank at the median, each rank alone at its peers' median) give
the same numbers as walking all of them at once, the way the replay did before it was made
linear in ranks (issue 22: 9, 29 and 113 MB held at 128, 256 and 512 ranks)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tracelab.analyzers import _replay


def _all_variants_at_once(start, gaps, part, med, tail, transfer):
    """The replay as it was: (ranks + 2) variants x matches x ranks walked together (each rank
    alone at its peers' median, median_of_peers' own loop form)."""
    n = len(start)
    nv = 2 + n
    g = np.repeat(gaps[None], nv, axis=0)
    tl = np.repeat(tail[None], nv, axis=0)
    g[1] = np.where(part, med.gaps[:, None], np.nan)
    tl[1] = med.tail
    peers_gaps = _peers_median_by_loop(gaps)  # (once: each rank's column of it below)
    peers_tail = _peers_median_by_loop(tail[None])[0]
    for i in range(n):
        g[2 + i][:, i] = np.where(part[:, i], peers_gaps[:, i], np.nan)
        tl[2 + i][i] = peers_tail[i]
    t = _replay._walk(np.tile(start, (nv, 1)), g, part, transfer)
    total = (t + tl).max(axis=1) - start.min()
    return float(total[0]), float(total[1]), total[2:]


def _peers_median_by_loop(x):
    out = np.full(x.shape, np.nan)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            if np.isnan(x[r, i]):
                continue
            others = np.delete(x[r], i)
            others = others[~np.isnan(others)]
            out[r, i] = np.median(others) if len(others) else x[r, i]
    return out


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
    tail = rng.integers(0, 100_000, ranks).astype(np.float64)
    transfer = rng.integers(0, 50_000, matches).astype(np.float64)
    med = _replay.Medians(
        gaps=np.nanmedian(gaps, axis=1),
        tail=float(np.median(tail)),
        peers_gaps=_replay.median_of_peers(gaps),
        peers_tail=_replay.median_of_peers(tail[None])[0],
    )
    return start, gaps, part, med, tail, transfer


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 9])
def test_median_of_peers_is_the_median_without_the_rank(ranks):
    rng = np.random.default_rng(ranks)
    x = rng.integers(0, 50, (40, ranks)).astype(np.float64)  # ties included
    x[rng.random(x.shape) < 0.3] = np.nan
    assert np.array_equal(_replay.median_of_peers(x), _peers_median_by_loop(x), equal_nan=True)


def test_a_slow_rank_of_two_is_saved_its_whole_lead():
    """Two ranks, one 60 ms later at every collective: alone at its peer's speed it saves the
    60 ms (the median of both ranks, its own gap included, saved 30: half the cost)."""
    gaps = np.array([[1.0, 61.0], [2.0, 62.0]]) * 1e6
    start, tail, transfer = np.zeros(2), np.zeros(2), np.array([1e6, 1e6])
    case = _replay.Medians(
        gaps=np.nanmedian(gaps, axis=1),
        tail=0.0,
        peers_gaps=_replay.median_of_peers(gaps),
        peers_tail=_replay.median_of_peers(tail[None])[0],
    )
    actual, _, alone = _replay._replay(start, gaps, np.ones_like(gaps, bool), case, tail, transfer)
    assert actual - alone[1] == 120e6 and actual - alone[0] == 0


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
    tail = np.zeros(4)
    med = _replay.Medians(
        gaps=np.nanmedian(gaps, axis=1),
        tail=0.0,
        peers_gaps=_replay.median_of_peers(gaps),
        peers_tail=_replay.median_of_peers(tail[None])[0],
    )
    actual, ideal, alone = _replay._replay(
        start, gaps, np.ones_like(gaps, bool), med, tail, np.array([5.0])
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


def _step_index_by_scan(seg_r, seg_a, srank, s0, s1):
    """The lost-time parts' step index as it was: every row scanned once per rank."""
    out = np.full(len(seg_r), -1, dtype=np.int64)
    order = np.lexsort((s0, srank))
    for rk in np.unique(srank):
        mine = order[srank[order] == rk]
        seg = np.flatnonzero(seg_r == rk)
        j = np.searchsorted(s0[mine], seg_a[seg], side="right") - 1
        ok = j >= 0
        jj = mine[np.where(ok, j, 0)]
        ok &= seg_a[seg] < s1[jj]
        out[seg[ok]] = jj[ok]
    return out


@pytest.mark.parametrize("ranks", [1, 3, 64])
def test_step_index_same_as_scanning_every_rank(ranks):
    from tracelab.derived.parts import _step_index

    rng = np.random.default_rng(ranks)
    steps = 6
    srank = np.repeat(np.arange(ranks), steps)
    bounds = np.cumsum(rng.integers(1, 1_000, (ranks, steps + 1)), axis=1) + 1_700_000_000 * 10**9
    s0, s1 = bounds[:, :-1].ravel(), bounds[:, 1:].ravel()
    perm = rng.permutation(len(srank))  # step spans come in any order
    srank, s0, s1 = srank[perm], s0[perm], s1[perm]
    n = 40 * ranks
    seg_r = rng.integers(0, ranks, n)
    seg_a = rng.integers(int(bounds.min()) - 5_000, int(bounds.max()) + 5_000, n)
    got = _step_index(seg_r, seg_a, srank, s0, s1)
    assert got.tolist() == _step_index_by_scan(seg_r, seg_a, srank, s0, s1).tolist()
    assert (got >= 0).any() and (got == -1).any()
