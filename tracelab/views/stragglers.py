"""Stragglers: who arrives last, who waits for whom, and what it costs per step.

Per-rank figures are the stragglers analyzer's (`ranks`: wait_ns_per_step, the wait it caused,
its what-if saving); per collective, its `collectives` table; arrivals come from the derived
layer's matched_collectives, one page of collectives at a time (COLLECTIVES_PER_PAGE), and the
skew series is capped at MAX_SKEW_POINTS (the largest kept), so every page is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.views.analysis import Analysis
from tracelab.views.context import RunContext
from tracelab.views.ranksummary import MATERIAL_SHARE, PICKED_RANKS, drawn_ranks

COLLECTIVES_PER_PAGE = 40
MAX_SKEW_POINTS = 2000
MAX_HEAT_RANKS = 256
#: Of more ranks than this, the wait chart draws a typical rank and those that stand out.
WAIT_RANKS = 32

ARRIVALS_SQL = """
SELECT match_key, rank, start_ns FROM matched_collectives
WHERE run_id = ? AND list_contains(?::VARCHAR[], match_key)
"""
SKEW_SQL = """
SELECT match_key, max(start_ns) - min(start_ns) AS skew_ns FROM matched_collectives
WHERE run_id = ? GROUP BY match_key
"""


@dataclass(frozen=True, kw_only=True)
class StragglerView:
    available: bool
    note: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Per collective, in time order: key, label, step, skew_ns (last minus first arrival),
    #: lateness_ns, last_rank, blameable, at_ms (last arrival, ms since run start).
    skew: list[dict[str, Any]] = field(default_factory=list)
    skew_cut: bool = False
    #: Arrival heatmap of one page of collectives: ranks x collectives, ns after the first.
    page: int = 1
    pages: int = 1
    heat_labels: list[str] = field(default_factory=list)
    heat_ranks: list[int] = field(default_factory=list)
    #: Ranks with arrivals on the page (heat_ranks is a pick of them when they are more).
    heat_total_ranks: int = 0
    heat_ns: list[list[int | None]] = field(default_factory=list)
    #: The analyzer's per-rank rows (raw ns), plus "blamed": the blamed first, then in order.
    ranks: list[dict[str, Any]] = field(default_factory=list)
    blamed: list[int] = field(default_factory=list)
    #: The rows the wait chart draws, and why each (empty when it draws every rank).
    wait_ranks: list[dict[str, Any]] = field(default_factory=list)
    wait_why: list[str] = field(default_factory=list)


def _label(c: dict[str, Any]) -> str:
    """A short collective label: op, step and its place in the step ('all_reduce s4 #1')."""
    key = str(c.get("key", ""))
    tail = key.rsplit(":", 1)[-1] if ":" in key else key
    step = f" s{c['step']}" if c.get("step") is not None else ""
    return f"{c.get('op', '?')}{step} #{tail}"


def _heat_ranks(
    arrivals: dict[str, dict[int, int]], first: dict[str, int], blamed: list[int]
) -> tuple[list[int], int]:
    """The heatmap's ranks, in rank order, and how many ranks arrived on the page: all of them
    up to MAX_HEAT_RANKS; of more, PICKED_RANKS: the blamed ranks and then the latest to arrive
    (their largest lateness on the page), so that a late rank 7,000 of 10,000 is drawn (the
    first 256 ranks were)."""
    late: dict[int, int] = {}
    for key, arr in arrivals.items():
        for rank, t in arr.items():
            late[rank] = max(late.get(rank, 0), t - first[key])
    if len(late) <= MAX_HEAT_RANKS:
        return sorted(late), len(late)
    order = sorted(late, key=lambda r: (r not in blamed, -late[r], r))
    return sorted(order[:PICKED_RANKS]), len(late)


def _wait_rows(
    rows: list[dict[str, Any]], blamed: list[int], step_ns: float | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The wait chart's rows: every rank up to WAIT_RANKS; of more, a typical rank (closest to
    the median wait) and the ranks that stand out (the blamed, then the outliers of the wait
    they suffered and caused: ranksummary.standouts), with why. 512 bars hid the straggler's."""
    if len(rows) <= WAIT_RANKS:
        return rows, []
    by_rank = {int(x["rank"]): x for x in rows}

    def per_step(key: str) -> dict[int, float]:
        return {r: float(x.get(key) or 0) for r, x in by_rank.items()}

    waited = per_step("wait_ns_per_step")
    metrics = {"waited": waited, "made others wait": per_step("caused_wait_ns_per_step")}
    material = MATERIAL_SHARE * float(step_ns or 0)
    singled = [("blamed", blamed)] if blamed else []
    chosen = drawn_ranks(metrics, waited, singled, material=material)
    return [by_rank[r] for r, _ in chosen], [why for _, why in chosen]


def straggler_view(
    con: duckdb.DuckDBPyConnection, analysis: Analysis, ctx: RunContext, page: int = 1
) -> StragglerView:
    result = analysis.get("stragglers")
    if result is None:
        return StragglerView(
            available=False, note=analysis.errors.get("stragglers", "the analyzer did not run")
        )
    if not result.metrics.get("matched"):
        return StragglerView(
            available=False, note=" ".join(result.notes) or "No collectives matched across ranks."
        )
    colls = sorted(
        result.tables.get("collectives", []),
        key=lambda c: (c.get("last_arrival_ns") or 0, str(c.get("key"))),
    )
    skews = {str(k): int(v) for k, v in con.execute(SKEW_SQL, [ctx.run_id]).fetchall()}
    skew = [
        {
            "key": c["key"],
            "label": _label(c),
            "step": c.get("step"),
            "skew_ns": skews.get(str(c["key"])),
            "lateness_ns": c.get("lateness_ns"),
            "last_rank": c.get("last_rank"),
            "blameable": bool(c.get("blameable")),
            "at_ms": None
            if c.get("last_arrival_ns") is None
            else round(ctx.to_ms(c["last_arrival_ns"]), 6),
        }
        for c in colls
    ]
    cut = len(skew) > MAX_SKEW_POINTS
    if cut:
        keep = {id(x) for x in sorted(skew, key=lambda x: -(x["skew_ns"] or 0))[:MAX_SKEW_POINTS]}
        skew = [x for x in skew if id(x) in keep]
    pages = max(1, -(-len(colls) // COLLECTIVES_PER_PAGE))
    page = min(max(1, page), pages)
    page_colls = colls[(page - 1) * COLLECTIVES_PER_PAGE : page * COLLECTIVES_PER_PAGE]
    keys = [str(c["key"]) for c in page_colls]
    arrivals: dict[str, dict[int, int]] = {}
    for key, rank, start in con.execute(ARRIVALS_SQL, [ctx.run_id, keys]).fetchall():
        arrivals.setdefault(str(key), {})[int(rank)] = int(start)
    blamed = [int(r) for r in (result.metrics.get("stragglers") or [])]
    first = {key: min(arr.values()) for key, arr in arrivals.items()}
    ranks, heat_total = _heat_ranks(arrivals, first, blamed)
    heat: list[list[int | None]] = []
    for rank in ranks:
        row: list[int | None] = []
        for key in keys:
            arr = arrivals.get(key, {})
            row.append(arr[rank] - first[key] if rank in arr else None)
        heat.append(row)
    # The blamed ranks first, then every rank in order: at 512 ranks a blamed rank 300 was on
    # the table's seventh page.
    rank_rows = [
        dict(x, blamed="yes" if int(x["rank"]) in blamed else "")
        for x in sorted(
            result.tables.get("ranks", []),
            key=lambda x: (int(x["rank"]) not in blamed, int(x["rank"])),
        )
    ]
    wait_rows, wait_why = _wait_rows(rank_rows, blamed, analysis.metric("steps", "step_ns"))
    return StragglerView(
        available=True,
        wait_ranks=wait_rows,
        wait_why=wait_why,
        note=" ".join(result.notes),
        metrics=dict(result.metrics),
        skew=skew,
        skew_cut=cut,
        page=page,
        pages=pages,
        heat_labels=[_label(c) for c in page_colls],
        heat_ranks=ranks,
        heat_total_ranks=heat_total,
        heat_ns=heat,
        ranks=rank_rows,
        blamed=blamed,
    )
