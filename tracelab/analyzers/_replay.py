"""The stragglers' what-if replay (Lin et al., OSDI 2025), over numpy columns of matched rows.

Per step, each rank's time before each collective (its "gap") and after the last one is walked
through the step's matched collectives in order: a collective starts when the last of its ranks
arrives and lasts its transfer time. Replaying with every rank's gaps set to the median across
the collective's ranks gives the ideal step time; with one rank's gaps set to the median of its
*peers* (the collective's other ranks), the step time had that rank alone run at its peers'
speed. The median is the peers', not every rank's: in a collective of two ranks (a 2-rank job,
any dimension of size 2 of a mesh) the median of both is halfway to the slow one, and a rank
that slept 60 ms a step was blamed for 30 (measured on plain-profiler captures: 29.9 ms against
a 60-62 ms sleep on 2 DDP ranks, 32.1 ms against 60.3 ms on a 2 x 2 FSDP2 x TP mesh). numpy
carries all the variants (actual, ideal, each rank alone) through one walk.

All times are rebased to the step's first start: ns counts and their medians (halves) stay exact
in a double, so the walk's sums do not depend on their order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Every matched row of run $run with its step bounds and its gap (time since the rank's
#: previous collective of the step, or the step's start): the replay's input.
GAPS_SQL = """
WITH st AS (SELECT rank, step, start_ns AS s0, end_ns AS s1 FROM step_spans WHERE run_id = $run),
g AS (
    SELECT m.rank, m.match_key AS key, m.op, m.step, m.start_ns AS a_ns, m.end_ns AS e_ns,
           m.ranks AS n, m.last_arrival_ns, m.last_rank, m.transfer_ns, m.wait_ns,
           m.lateness_ns, st.s0, st.s1,
           coalesce(lag(m.end_ns) OVER (PARTITION BY m.rank, m.step ORDER BY m.start_ns),
                    least(st.s0, m.start_ns)) AS prev_ns
    FROM matched_collectives m LEFT JOIN st ON st.rank = m.rank AND st.step = m.step
    WHERE m.run_id = $run
)
SELECT *, greatest(a_ns - prev_ns, 0) AS gap_ns FROM g ORDER BY step, last_arrival_ns, rank
"""


def whatif_key(rank: int) -> str:
    """The Claim.cap_key of a finding capped by this rank's what-if saving: findings that name
    the same rank's saving share it (tracelab.analyzers._budget)."""
    return f"whatif:rank {rank}"


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
        pos = np.minimum(np.searchsorted(ranks_arr, rk_idx), len(ranks) - 1)
        mine = ranks_arr[pos] == rk_idx
        # Per rank, its rows' last end (at least base): one pass, not a scan of every row per
        # rank (10,000 ranks: 2.1 s of the analysis).
        last_end = np.full(len(ranks), base, dtype=np.int64)
        np.maximum.at(last_end, pos[mine], cols["e_ns"][idx][mine].astype(np.int64))
        row_of = np.full(len(code), -1)
        row_of[[code[m["key"]] for m in mlist]] = np.arange(len(mlist))
        rows = row_of[cols["key"][idx]]
        ok = (rows >= 0) & mine
        gaps = np.full((len(mlist), len(ranks)), np.nan)
        gaps[rows[ok], pos[ok]] = cols["gap_ns"][idx][ok].astype(np.float64)
        part = ~np.isnan(gaps)
        tail = np.maximum(0, step_end - last_end).astype(np.float64)
        medians = Medians(
            gaps=np.nanmedian(gaps, axis=1),
            tail=float(np.median(tail)),
            peers_gaps=median_of_peers(gaps),
            peers_tail=median_of_peers(tail[None])[0],
        )
        transfer = np.array([float(m["transfer"]) for m in mlist])
        actual, ideal, alone = _replay(start, gaps, part, medians, tail, transfer)
        for i, rk in enumerate(ranks):
            savings.setdefault(rk, []).append(actual - float(alone[i]))
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


@dataclass(frozen=True, kw_only=True)
class Medians:
    """What the replay's variants set gaps to: per match, the median gap of its ranks (the
    ideal), and per match and rank the median of the rank's peers (each rank alone); the same
    for the time after the last collective (per rank)."""

    gaps: np.ndarray
    tail: float
    peers_gaps: np.ndarray
    peers_tail: np.ndarray


def median_of_peers(x: np.ndarray) -> np.ndarray:
    """Per row of `x` (rows x ranks, NaN where a rank takes no part), for each rank taking
    part the median of the row's other values; a rank alone in its row keeps its own value (it
    has no peers to run like). NaN where `x` is. Sums of ns counts and their halves, as
    np.nanmedian gives them."""
    rows, n = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # NaN last
    ordered = np.take_along_axis(x, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(n), (rows, n)), axis=1)
    others = (~np.isnan(x)).sum(axis=1)[:, None] - 1

    def of_others(j: np.ndarray) -> np.ndarray:
        """The j-th smallest of the other values: skip the rank's own place."""
        at = np.clip(np.where(j < pos, j, j + 1), 0, n - 1)
        return np.take_along_axis(ordered, at, axis=1)

    med = (of_others((others - 1) // 2) + of_others(others // 2)) / 2
    return np.where(np.isnan(x), np.nan, np.where(others >= 1, med, x))


#: Variants walked at once where some collective spans only part of the ranks: the walk then
#: holds VARIANT_CHUNK x matches x ranks doubles, never (ranks + 2) x matches x ranks.
VARIANT_CHUNK = 32


def _replay(
    start: np.ndarray,
    gaps: np.ndarray,
    part: np.ndarray,
    med: Medians,
    tail: np.ndarray,
    transfer: np.ndarray,
) -> tuple[float, float, np.ndarray]:
    """The replayed step time as measured, with every rank at the median, and with each rank
    alone at its peers' median (an array over ranks). `gaps`: matches x ranks, NaN where the
    rank is not in the match (`part` False); `start`: each rank's first start, rebased."""
    if part.all():
        return _replay_full(start, gaps, med, tail, transfer)
    n = len(start)
    totals = np.empty(n + 2)
    variants = np.arange(-2, n)  # -2 actual, -1 every rank at the median, i >= 0 rank i alone
    for lo in range(0, len(variants), VARIANT_CHUNK):
        chunk = variants[lo : lo + VARIANT_CHUNK]
        g = np.repeat(gaps[None], len(chunk), axis=0)
        tl = np.repeat(tail[None], len(chunk), axis=0)
        for j, v in enumerate(chunk):
            if v == -1:
                g[j] = np.where(part, med.gaps[:, None], np.nan)
                tl[j] = med.tail
            elif v >= 0:
                g[j][:, v] = med.peers_gaps[:, v]
                tl[j][v] = med.peers_tail[v]
        t = _walk(np.tile(start, (len(chunk), 1)), g, part, transfer)
        totals[lo : lo + len(chunk)] = (t + tl).max(axis=1) - start.min()
    return float(totals[0]), float(totals[1]), totals[2:]


def _without_each(x: np.ndarray) -> np.ndarray:
    """Per row of `x` (rows x ranks), the maximum over the other ranks, for each rank: the row
    maximum, or the second largest value in the maximum's own column (-inf for one rank)."""
    top = x.argmax(axis=1)
    rows = np.arange(len(x))
    first = x[rows, top]
    rest = x.copy()
    rest[rows, top] = -np.inf
    second = rest.max(axis=1)
    out = np.repeat(first[:, None], x.shape[1], axis=1)
    out[rows, top] = second
    return out


def _replay_full(
    start: np.ndarray,
    gaps: np.ndarray,
    med: Medians,
    tail: np.ndarray,
    transfer: np.ndarray,
) -> tuple[float, float, np.ndarray]:
    """_replay when every collective spans every rank (the common case): after the first one
    all ranks share one clock, so each variant is a sum of per-collective maxima, and a rank
    alone at the median changes only its own column of each maximum. Linear in ranks x
    matches, in time and memory; the same numbers as the walk (sums of ns counts and their
    halves are exact in a double, whatever their order)."""
    lead = start + gaps[0]
    rest = gaps[1:].max(axis=1) + transfer[1:]
    base = float(start.min())
    actual = lead.max() + transfer[0] + rest.sum() + tail.max() - base
    ideal = (
        (start + med.gaps[0]).max()
        + transfer[0]
        + (med.gaps[1:] + transfer[1:]).sum()
        + med.tail
        - base
    )
    lead_i = np.maximum(_without_each(lead[None])[0], start + med.peers_gaps[0])
    rest_i = np.maximum(_without_each(gaps[1:]), med.peers_gaps[1:]) + transfer[1:, None]
    tail_i = np.maximum(_without_each(tail[None])[0], med.peers_tail)
    alone = lead_i + transfer[0] + rest_i.sum(axis=0) + tail_i - base
    return float(actual), float(ideal), alone


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


def matches(data: pa.Table, unc: dict[int, int]) -> list[dict[str, Any]]:
    """One dict per match (its last arriver's row), in step and arrival order."""
    ranks_of: dict[str, list[int]] = {}
    for key, rk in zip(
        data.column("key").to_pylist(), data.column("rank").to_pylist(), strict=True
    ):
        ranks_of.setdefault(key, []).append(rk)
    out = []
    last = data.filter(pc.equal(data.column("rank"), data.column("last_rank")))
    for x in last.to_pylist():
        margin = unc.get(x["rank"], 0) + max(
            (v for o, v in unc.items() if o != x["rank"]), default=0
        )
        out.append(
            {
                "key": x["key"],
                "op": x["op"],
                "step": x["step"],
                "last_rank": x["rank"],
                "lateness_ns": x["lateness_ns"],
                "blameable": x["lateness_ns"] > margin,
                "transfer": x["transfer_ns"],
                "A": x["last_arrival_ns"],
                "ranks": sorted(ranks_of[x["key"]]),
            }
        )
    out.sort(key=lambda m: (m["step"] if m["step"] is not None else -1, m["A"]))
    return out
