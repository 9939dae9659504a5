"""Two runs side by side: every numeric metric with its delta, and the step time distributions.

Distributions travel as summaries (quantiles and a shared histogram), never as raw samples, so
the payload is the same for 10 steps or 10 million.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.views.analysis import Analysis

#: Histogram bins of the step time distributions.
HIST_BINS = 40
#: A metric whose relative change exceeds this is marked as moved.
MOVED = 0.05

DIST_SQL = """
SELECT count(*), min(d), quantile_cont(d, 0.25), median(d), quantile_cont(d, 0.75), max(d), avg(d)
FROM (SELECT (coalesce(device_end_ns, end_ns) - start_ns) / 1e6 AS d FROM steps WHERE run_id = ?)
"""
HIST_SQL = """
SELECT least(CAST(floor((d - ?) / ?) AS BIGINT), ? - 1) AS bin, count(*)
FROM (SELECT (coalesce(device_end_ns, end_ns) - start_ns) / 1e6 AS d FROM steps WHERE run_id = ?)
GROUP BY bin ORDER BY bin
"""


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """Step time (ms, every rank x step) of one run: count, quantiles, mean, histogram counts."""

    count: int
    min: float | None
    q1: float | None
    median: float | None
    q3: float | None
    max: float | None
    mean: float | None
    hist: list[int]


@dataclass(frozen=True, kw_only=True)
class StepComparison:
    a: Distribution
    b: Distribution
    #: Left edges of the shared histogram bins, and their width (ms).
    edges: list[float]
    width: float


def _dist(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[Any, ...]:
    row = con.execute(DIST_SQL, [run_id]).fetchone()
    return row if row is not None else (0, None, None, None, None, None, None)


def step_comparison(con: duckdb.DuckDBPyConnection, a_id: int, b_id: int) -> StepComparison:
    """Both runs' step time summaries over one shared set of histogram bins."""
    da, db = _dist(con, a_id), _dist(con, b_id)
    lows = [x[1] for x in (da, db) if x[1] is not None]
    highs = [x[5] for x in (da, db) if x[5] is not None]
    lo, hi = (min(lows), max(highs)) if lows else (0.0, 1.0)
    width = max((hi - lo) / HIST_BINS, 1e-9)
    edges = [lo + i * width for i in range(HIST_BINS)]

    def build(run_id: int, d: tuple[Any, ...]) -> Distribution:
        hist = [0] * HIST_BINS
        if d[0]:
            for b, n in con.execute(HIST_SQL, [lo, width, HIST_BINS, run_id]).fetchall():
                hist[max(0, int(b))] += int(n)
        vals = [None if v is None else round(float(v), 6) for v in d[1:]]
        return Distribution(count=int(d[0]), min=vals[0], q1=vals[1], median=vals[2], q3=vals[3],
                            max=vals[4], mean=vals[5], hist=hist)

    return StepComparison(a=build(a_id, da), b=build(b_id, db), edges=edges, width=width)


def _flatten(analysis: Analysis) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in analysis.results:
        for key, value in r.metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out[f"{r.analyzer}: {key}"] = float(value)
    return out


def metric_deltas(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    """Every numeric metric either run has: values, delta (b - a), relative delta, moved flag.
    Moved metrics come first, largest relative change first."""
    fa, fb = _flatten(a), _flatten(b)
    rows: list[dict[str, Any]] = []
    for key in sorted(fa.keys() | fb.keys()):
        va, vb = fa.get(key), fb.get(key)
        delta = None if va is None or vb is None else vb - va
        rel = None if delta is None or not va else delta / abs(va)
        rows.append({"metric": key, "a": va, "b": vb, "delta": delta,
                     "delta_pct": None if rel is None else round(100 * rel, 2),
                     "moved": rel is not None and abs(rel) > MOVED})
    rows.sort(key=lambda r: (not r["moved"], -abs(r["delta_pct"] or 0.0), r["metric"]))
    return rows


def finding_changes(a: Analysis, b: Analysis) -> dict[str, list[str]]:
    """Finding codes new in b, gone from a, and in both (by code and ranks)."""
    def keys(x: Analysis) -> dict[tuple[str, tuple[int, ...]], str]:
        return {(f.code, f.evidence.ranks): f.title for f in x.findings()}

    ka, kb = keys(a), keys(b)
    return {
        "new": [kb[k] for k in kb if k not in ka],
        "resolved": [ka[k] for k in ka if k not in kb],
        "persisting": [kb[k] for k in kb if k in ka],
    }
