"""Stragglers: arrival skew per collective, wait per rank, and the blamed ranks with evidence.

The analyzer's per-(collective, rank) table grows with ranks x collectives; this view pages the
collectives (COLLECTIVES_PER_PAGE at a time for the arrival heatmap) and caps the skew series at
MAX_SKEW_POINTS (the largest skews are kept), so every page has a bounded size.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tracelab.views._run import RunContext
from tracelab.views.analysis import Analysis

COLLECTIVES_PER_PAGE = 40
MAX_SKEW_POINTS = 2000
MAX_HEAT_RANKS = 256


@dataclass(frozen=True, kw_only=True)
class StragglerView:
    available: bool
    note: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Per collective, in time order: label, step, skew_ms (last minus first arrival), last_rank,
    #: blameable, at_ms (last arrival, ms since run start).
    skew: list[dict[str, Any]] = field(default_factory=list)
    skew_cut: bool = False
    #: Arrival heatmap of one page of collectives: ranks x collectives, ms after the first arrival.
    page: int = 1
    pages: int = 1
    heat_labels: list[str] = field(default_factory=list)
    heat_ranks: list[int] = field(default_factory=list)
    heat_ms: list[list[float | None]] = field(default_factory=list)
    #: Per rank: total and median wait (ms) and the analyzer's blame columns.
    ranks: list[dict[str, Any]] = field(default_factory=list)
    blamed: list[int] = field(default_factory=list)


def straggler_view(analysis: Analysis, ctx: RunContext, page: int = 1) -> StragglerView:
    result = analysis.get("stragglers")
    if result is None:
        return StragglerView(available=False,
                             note=analysis.errors.get("stragglers", "the analyzer did not run"))
    if not result.metrics.get("matched"):
        return StragglerView(available=False, note=" ".join(result.notes)
                             or "No collectives matched across ranks.")
    colls = result.tables.get("collectives", [])
    waits = result.tables.get("waits", [])
    arrivals: dict[str, dict[int, int]] = defaultdict(dict)
    wait_by_rank: dict[int, list[float]] = defaultdict(list)
    for w in waits:
        arrivals[w["key"]][int(w["rank"])] = int(w["arrival_ns"])
        if w.get("wait_ms") is not None:
            wait_by_rank[int(w["rank"])].append(float(w["wait_ms"]))
    skew = []
    for c in colls:
        arr = arrivals.get(c["key"], {})
        skew_ms = round((max(arr.values()) - min(arr.values())) / 1e6, 6) if arr else None
        skew.append({
            "key": c["key"], "label": f"{c['op']} {c['key']}", "step": c.get("step"),
            "skew_ms": skew_ms,
            "last_rank": c.get("last_rank"), "blameable": bool(c.get("blameable")),
            "at_ms": round(ctx.to_ms(c["last_arrival_ns"]), 6)
            if c.get("last_arrival_ns") is not None else None,
        })
    cut = len(skew) > MAX_SKEW_POINTS
    shown = skew
    if cut:
        keep = {id(x) for x in sorted(skew, key=lambda x: -(x["skew_ms"] or 0))[:MAX_SKEW_POINTS]}
        shown = [x for x in skew if id(x) in keep]
    pages = max(1, -(-len(colls) // COLLECTIVES_PER_PAGE))
    page = min(max(1, page), pages)
    page_colls = colls[(page - 1) * COLLECTIVES_PER_PAGE: page * COLLECTIVES_PER_PAGE]
    ranks = sorted({r for c in page_colls for r in arrivals.get(c["key"], {})})[:MAX_HEAT_RANKS]
    heat: list[list[float | None]] = []
    for rank in ranks:
        row: list[float | None] = []
        for c in page_colls:
            arr = arrivals.get(c["key"], {})
            row.append(round((arr[rank] - min(arr.values())) / 1e6, 6) if rank in arr else None)
        heat.append(row)
    rank_rows: dict[int, dict[str, Any]] = {
        int(x["rank"]): dict(x) for x in result.tables.get("ranks", [])}
    for rank, ws in wait_by_rank.items():
        rank_rows.setdefault(rank, {"rank": rank})["wait_ms_median"] = round(
            statistics.median(ws), 6)
    blamed = [int(r) for r in (result.metrics.get("stragglers") or [])]
    for info in rank_rows.values():
        info["blamed"] = "yes" if info["rank"] in blamed else ""
    return StragglerView(
        available=True, note=" ".join(result.notes), metrics=dict(result.metrics),
        skew=shown, skew_cut=cut, page=page, pages=pages,
        heat_labels=[f"{c['op']} {c['key']}" for c in page_colls], heat_ranks=ranks,
        heat_ms=heat, ranks=[rank_rows[r] for r in sorted(rank_rows)], blamed=blamed,
    )
