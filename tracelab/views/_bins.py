"""Binning of intervals per lane with numpy: the busy share (union of intervals) and event counts
of each (lane, time bin), from the visible events that DuckDB filtered and sorted.

The union is a running maximum of end times along each lane's events in start order: an event
adds the part of itself past every earlier end, so the added pieces are disjoint and sum to the
union (nested host ops count once). DuckDB's windowed running max over a million rows costs about
a second on two cores; `np.maximum.accumulate` over the same sorted arrays costs milliseconds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


def union_busy(
    lane: I64, s: I64, t: I64, n_lanes: int, a: int, w: int, nbins: int
) -> npt.NDArray[np.float64]:
    """Busy ns per (lane, bin), shape (n_lanes, nbins). Inputs: events sorted by (lane, s),
    already clipped to the window [a, a + w * nbins]; `a` and `w` in ns."""
    out = np.zeros(n_lanes * nbins, dtype=np.float64)
    if lane.size == 0:
        return out.reshape(n_lanes, nbins)
    span = w * nbins + 1
    # Shift each lane by lane * span so that one global running max never crosses lanes.
    base = lane.astype(np.int64) * span
    s2, t2 = (s - a) + base, (t - a) + base
    run = np.maximum.accumulate(t2)
    prev = np.empty_like(run)
    prev[0] = np.iinfo(np.int64).min
    prev[1:] = run[:-1]
    u = np.maximum(s2, prev)
    keep = t2 > u
    u, v, ln = u[keep] - base[keep], t2[keep] - base[keep], lane[keep]
    b0 = u // w
    b1 = (v - 1) // w
    flat0 = ln * nbins + b0
    one = b0 == b1
    np.add.at(out, flat0[one], (v - u)[one].astype(np.float64))
    many = ~one
    if many.any():
        u_m, v_m, b0_m, b1_m, ln_m = u[many], v[many], b0[many], b1[many], ln[many]
        np.add.at(out, ln_m * nbins + b0_m, ((b0_m + 1) * w - u_m).astype(np.float64))
        np.add.at(out, ln_m * nbins + b1_m, (v_m - b1_m * w).astype(np.float64))
        # Full bins strictly between b0 and b1: w each, through a difference array.
        diff = np.zeros(n_lanes * nbins + 1, dtype=np.float64)
        inner = b1_m > b0_m + 1
        np.add.at(diff, ln_m[inner] * nbins + b0_m[inner] + 1, float(w))
        np.add.at(diff, ln_m[inner] * nbins + b1_m[inner], -float(w))
        out += np.cumsum(diff)[:-1]
    return out.reshape(n_lanes, nbins)


def start_counts(lane: I64, s: I64, n_lanes: int, a: int, w: int, nbins: int) -> I64:
    """Events per (lane, bin of their start, clipped to the window), shape (n_lanes, nbins)."""
    b = np.clip((s - a) // w, 0, nbins - 1)
    flat = np.bincount(lane * nbins + b, minlength=n_lanes * nbins)
    return flat.astype(np.int64).reshape(n_lanes, nbins)


def sum_binned(
    lane: I64, s: I64, t: I64, n_lanes: int, a: int, w: int, nbins: int
) -> npt.NDArray[np.float64]:
    """Summed ns per (lane, bin) of intervals in any order, shape (n_lanes, nbins): the union
    when a lane's intervals are disjoint (the lost-time segments), else a sum (an upper bound,
    used only to rank what a lane was busiest with). Inputs clipped to the window."""
    size = n_lanes * nbins
    if lane.size == 0:
        return np.zeros((n_lanes, nbins), dtype=np.float64)
    u, v = s - a, t - a
    keep = v > u
    u, v, ln = u[keep], v[keep], lane[keep]
    b0 = np.minimum(u // w, nbins - 1)
    b1 = np.minimum((v - 1) // w, nbins - 1)
    base = ln * nbins
    one = b0 == b1
    out = np.bincount(base[one] + b0[one], weights=(v - u)[one], minlength=size)[:size]
    many = ~one
    if many.any():
        u_m, v_m, b0_m, b1_m, base_m = u[many], v[many], b0[many], b1[many], base[many]
        out = out + np.bincount(base_m + b0_m, weights=(b0_m + 1) * w - u_m, minlength=size)[:size]
        out = out + np.bincount(base_m + b1_m, weights=v_m - b1_m * w, minlength=size)[:size]
        inner = b1_m > b0_m + 1
        diff = (
            np.bincount(base_m[inner] + b0_m[inner] + 1, minlength=size + 1)[: size + 1]
            - np.bincount(base_m[inner] + b1_m[inner], minlength=size + 1)[: size + 1]
        )
        out = out + np.cumsum(diff)[:-1] * float(w)  # type: ignore[assignment]
    return out.astype(np.float64).reshape(n_lanes, nbins)
