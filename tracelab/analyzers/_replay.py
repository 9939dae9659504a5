"""The stragglers' what-if replay (Lin et al., OSDI 2025), over numpy columns of matched rows.

Per step, each rank's time before each collective (its "gap") and after the last one is walked
through the step's matched collectives in order: a collective starts when the last of its ranks
arrives and lasts its transfer time. Replaying with one rank's gaps (or every rank's) set to the
median across ranks gives the step time had that rank (or every rank) run at the median speed.
numpy carries all the variants (actual, ideal, each rank alone at the median) through one walk.

All times are rebased to the step's first start: ns counts and their medians (halves) stay exact
in a double, so the walk's sums do not depend on their order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa


def columns(data: pa.Table) -> dict[str, np.ndarray]:
    """The columns the replay reads, as numpy: int64 with nulls as 0, plus `has_step` (the row
    has step bounds: s0/s1 not null), `in_step` (step not null) and `key` as codes into
    `keys` (Python list)."""
    out: dict[str, Any] = {}
    for name in ("rank", "step", "s0", "s1", "prev_ns", "e_ns", "gap_ns"):
        col = data.column(name)
        out[name] = col.fill_null(0).to_numpy().astype(np.int64, copy=False)
    out["in_step"] = data.column("step").is_valid().to_numpy(zero_copy_only=False)
    out["has_step"] = data.column("s0").is_valid().to_numpy(zero_copy_only=False)
    enc = data.column("key").combine_chunks().dictionary_encode()
    out["key"] = enc.indices.to_numpy().astype(np.int64, copy=False)
    out["keys"] = enc.dictionary.to_pylist()
    return out


def whatif(
    per_match: list[dict[str, Any]], cols: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[int, list[float]]]:
    """Per step: measured and replayed step time, all-ranks-at-median ideal, and per rank the
    saving had that rank alone run at the median. `per_match`: the matches in step and arrival
    order; `cols`: columns() of every matched row, in step, last arrival and rank order."""
    code = {k: i for i, k in enumerate(cols["keys"])}
    matches_of: dict[Any, list[dict[str, Any]]] = {}
    for m in per_match:
        matches_of.setdefault(m["step"], []).append(m)
    out: list[dict[str, Any]] = []
    savings: dict[int, list[float]] = {}
    for step, mlist in matches_of.items():
        if step is None:
            continue
        idx = np.flatnonzero(cols["in_step"] & (cols["step"] == step))
        ws = idx[cols["has_step"][idx]]
        if not len(ws):
            continue
        firsts = np.minimum(cols["s0"][ws], cols["prev_ns"][ws])
        base = int(firsts.min())
        # Per rank, its last row's start and step end (rows in data order).
        rk_ws = cols["rank"][ws]
        ranks_arr, back = np.unique(rk_ws[::-1], return_index=True)
        last = len(ws) - 1 - back
        ranks = [int(x) for x in ranks_arr]
        start = (firsts[last] - base).astype(np.float64)
        step_end = cols["s1"][ws][last]
        col = {rk: i for i, rk in enumerate(ranks)}
        mlist = [m for m in mlist if all(rk in col for rk in m["ranks"])]
        if not mlist:
            continue
        rk_idx = cols["rank"][idx]
        last_end = np.array([max(base, int(cols["e_ns"][idx][rk_idx == rk].max())) for rk in ranks])
        row_of = np.full(len(code), -1)
        row_of[[code[m["key"]] for m in mlist]] = np.arange(len(mlist))
        rows = row_of[cols["key"][idx]]
        pos = np.minimum(np.searchsorted(ranks_arr, rk_idx), len(ranks) - 1)
        ok = (rows >= 0) & (ranks_arr[pos] == rk_idx)
        gaps = np.full((len(mlist), len(ranks)), np.nan)
        gaps[rows[ok], pos[ok]] = cols["gap_ns"][idx][ok].astype(np.float64)
        part = ~np.isnan(gaps)
        med = np.nanmedian(gaps, axis=1)
        tail = np.maximum(0, step_end - last_end).astype(np.float64)
        med_tail = float(np.median(tail))
        # Variants: 0 actual, 1 every rank at the median, 2 + i rank i alone at the median.
        nv = 2 + len(ranks)
        g = np.repeat(gaps[None], nv, axis=0)
        tl = np.repeat(tail[None], nv, axis=0)
        g[1] = np.where(part, med[:, None], np.nan)
        tl[1] = med_tail
        for i in range(len(ranks)):
            g[2 + i][:, i] = np.where(part[:, i], med, np.nan)
            tl[2 + i][i] = med_tail
        transfer = np.array([float(m["transfer"]) for m in mlist])
        t = _walk(np.tile(start, (nv, 1)), g, part, transfer)
        total = (t + tl).max(axis=1) - start.min()
        actual, ideal = float(total[0]), float(total[1])
        for i, rk in enumerate(ranks):
            savings.setdefault(rk, []).append(actual - float(total[2 + i]))
        measured = int(step_end.max()) - base
        out.append(
            {
                "step": step,
                "step_ns": measured,
                "replayed_step_ns": actual,
                "ideal_step_ns": ideal,
                "slowdown": actual / ideal if ideal else None,
                "saved_ns": actual - ideal,
            }
        )
    return sorted(out, key=lambda s: s["step"]), savings


def _walk(t: np.ndarray, g: np.ndarray, part: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """Each variant's per-rank clock (t: variants x ranks) after the collectives in order:
    collective k (gaps g[:, k], ranks part[k]) ends, on each of its ranks, at the last
    arrival plus transfer[k]. Once a collective spans every rank, all ranks share one clock,
    so the rest (if it too spans every rank) is a sum."""
    k = 0
    while k < len(transfer):
        cols = part[k]
        if cols.all() and part[k:].all():
            arrive = (t + g[:, k]).max(axis=1) + transfer[k]
            rest = (g[:, k + 1 :].max(axis=2) + transfer[k + 1 :]).sum(axis=1)
            t[:] = (arrive + rest)[:, None]
            return t
        arrive = (t[:, cols] + g[:, k, cols]).max(axis=1)
        t[:, cols] = (arrive + transfer[k])[:, None]
        k += 1
    return t
