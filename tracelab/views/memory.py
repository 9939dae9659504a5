"""Memory: peak per rank and per stage against capacity, the imbalance, and memory over time.

Peaks and imbalance come from the memory analyzer (so the page and `tracelab analyze` agree);
the time series is binned here in SQL: at most MAX_SERIES_RANKS ranks (the highest peaks) and
SERIES_BINS points each, whatever the number of allocation events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.views._run import RunContext
from tracelab.views.analysis import Analysis

SERIES_BINS = 400
MAX_SERIES_RANKS = 16
GIB = 1024**3

SERIES_SQL = """
WITH m AS (
    SELECT m.rank, m.ts_ns - o.off_ns AS t, m.allocated_bytes, m.reserved_bytes
    FROM memory m JOIN (SELECT unnest(?::INTEGER[]) AS rank, unnest(?::BIGINT[]) AS off_ns) o
      USING (rank)
    WHERE m.run_id = ? AND m.source = 'trace' AND m.allocated_bytes IS NOT NULL
),
top AS (SELECT rank FROM m GROUP BY rank ORDER BY max(allocated_bytes) DESC, rank LIMIT ?),
b AS (SELECT min(t) AS lo, greatest(max(t) - min(t), 1) AS span FROM m)
SELECT m.rank, least(CAST(floor((m.t - b.lo) * ? / b.span) AS BIGINT), ? - 1) AS bin,
       max(m.allocated_bytes), max(m.reserved_bytes), min(m.t)
FROM m JOIN top USING (rank), b
GROUP BY ALL ORDER BY m.rank, bin
"""


@dataclass(frozen=True, kw_only=True)
class MemorySeries:
    """Per rank: bin start (ms since run start) and the max allocated/reserved (GiB) in each bin."""

    ranks: list[int]
    t_ms: dict[int, list[float]]
    allocated_gib: dict[int, list[float | None]]
    reserved_gib: dict[int, list[float | None]]
    total_ranks: int


def memory_series(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> MemorySeries:
    """Allocated and reserved memory over time from the trace's [memory] events, binned."""
    p = ctx.params()
    found = con.execute(
        "SELECT count(DISTINCT rank) FROM memory WHERE run_id = ? AND source = 'trace'",
        [ctx.run_id]).fetchone()
    total = found[0] if found else 0
    rows = con.execute(SERIES_SQL, [p["off_ranks"], p["off_ns"], ctx.run_id, MAX_SERIES_RANKS,
                                    SERIES_BINS, SERIES_BINS]).fetchall()
    t: dict[int, list[float]] = {}
    alloc: dict[int, list[float | None]] = {}
    res: dict[int, list[float | None]] = {}
    for rank, _bin, a, rsv, t0 in rows:
        rank = int(rank)
        t.setdefault(rank, []).append(round(ctx.to_ms(t0), 6))
        alloc.setdefault(rank, []).append(None if a is None else round(a / GIB, 6))
        res.setdefault(rank, []).append(None if rsv is None else round(rsv / GIB, 6))
    return MemorySeries(ranks=sorted(t), t_ms=t, allocated_gib=alloc, reserved_gib=res,
                        total_ranks=int(total))


@dataclass(frozen=True, kw_only=True)
class MemoryView:
    available: bool
    note: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Per rank: peak_gib, capacity_gib, headroom (peak / capacity), stage, source.
    ranks: list[dict[str, Any]] = field(default_factory=list)
    #: Per stage: peak_gib (max over the stage's ranks), and the expected pattern when known.
    stages: list[dict[str, Any]] = field(default_factory=list)

    def headline(self) -> str:
        """The imbalance and headroom in one sentence."""
        m = self.metrics
        parts = []
        if m.get("peak_gib_max") is not None:
            bound = " (a lower bound: trace events only)" if m.get("peak_is_lower_bound") else ""
            parts.append(f"highest peak {m['peak_gib_max']:.3g} GiB{bound}")
        caps = [float(r["headroom_used"]) for r in self.ranks
                if r.get("headroom_used") is not None]
        if caps:
            parts.append(f"up to {100 * max(caps):.3g}% of device capacity used")
        if m.get("max_over_mean") is not None:
            exp = m.get("expected_max_over_mean")
            parts.append(f"stage imbalance max/mean {m['max_over_mean']:.3g}"
                         + (f" (the {m.get('schedule')} schedule predicts {exp:.3g})" if exp else "")
                         + (f", max/min {m['max_over_min']:.3g}" if m.get("max_over_min") else ""))
        return "; ".join(parts).capitalize() + "." if parts else ""


def _gib(x: Any) -> float | None:
    return None if x is None else round(float(x) / GIB, 6)


def memory_view(analysis: Analysis) -> MemoryView:
    """The memory analyzer's per-rank and per-stage peaks, in GiB, with capacity."""
    result = analysis.get("memory")
    if result is None:
        return MemoryView(available=False,
                          note=analysis.errors.get("memory", "the memory analyzer did not run"))
    ranks = []
    for row in result.tables.get("ranks", []):
        out = dict(row)
        for key in list(row):
            if key.endswith("_bytes"):
                out[key.replace("_bytes", "_gib")] = _gib(row[key])
        ranks.append(out)
    stages = []
    for row in result.tables.get("stages", []):
        out = dict(row)
        for key in list(row):
            if key.endswith("_bytes"):
                out[key.replace("_bytes", "_gib")] = _gib(row[key])
        stages.append(out)
    return MemoryView(available=bool(ranks), metrics=dict(result.metrics), ranks=ranks,
                      stages=stages, note=" ".join(result.notes)
                      or ("" if ranks else "No memory samples in this run."))
