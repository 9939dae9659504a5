"""Two runs side by side: the report's comparison rows (tracelab.report: the same metrics,
thresholds, tests and verdicts as `tracelab report`), most significant first, and the step time
distributions.

Distributions travel as summaries (quantiles and a shared histogram), never as raw samples, so
the payload is the same for 10 steps or 10 million.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.render.text import duration, size
from tracelab.views.analysis import Analysis

#: Histogram bins of the step time distributions.
HIST_BINS = 40

#: Step times of the steady steps of one run, every rank x step (step_spans.dur_ns, ms).
_STEPS = "(SELECT dur_ns / 1e6 AS d FROM step_spans WHERE run_id = ? AND steady)"
DIST_SQL = f"""
SELECT count(*), min(d), quantile_cont(d, 0.25), median(d), quantile_cont(d, 0.75), max(d), avg(d)
FROM {_STEPS}
"""
HIST_SQL = f"""
SELECT least(CAST(floor((d - ?) / ?) AS BIGINT), ? - 1) AS bin, count(*)
FROM {_STEPS} GROUP BY bin ORDER BY bin
"""


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """Steady step time (ms, every rank x step) of one run: count, quantiles, mean, histogram."""

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
    """Both runs' steady step time summaries over one shared set of histogram bins."""
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
        return Distribution(
            count=int(d[0]),
            min=vals[0],
            q1=vals[1],
            median=vals[2],
            q3=vals[3],
            max=vals[4],
            mean=vals[5],
            hist=hist,
        )

    return StepComparison(a=build(a_id, da), b=build(b_id, db), edges=edges, width=width)


def value_text(v: float | None, unit: str) -> str:
    """A report metric in its unit ('76.4 ms', '12.3%', '330 MiB')."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "ms":
        return duration(v * 1e6)
    if unit == "share":
        return f"{100 * v:.1f}%"
    if unit == "bytes":
        return size(v)
    if unit == "ratio":
        return f"{v:.2f}×"
    if unit == "GB/s":
        return f"{v:.3g} GB/s"
    return f"{v:.4g} {unit}"


def delta_text(d: float | None, kind: Any) -> str:
    if d is None or (isinstance(d, float) and math.isnan(d)):
        return "-"
    if str(kind) == "points":
        return f"{d:+.1f} pp"
    if math.isinf(d):
        return "new" if d > 0 else "gone"
    return f"{100 * d:+.1f}%"


#: Verdicts by how much they matter: what fails the report first, what is only context last.
VERDICT_RANK = {"regression": 0, "improved": 1, "warn": 2, "pass": 3, "info": 4}
VERDICT_TEXT = {
    "regression": "regression",
    "improved": "improved",
    "warn": "cannot judge",
    "pass": "within threshold",
    "info": "not gated",
}


def comparison_rows(report: Any) -> list[dict[str, Any]]:
    """The report's rows (tracelab.report.compare.Report.rows) for the page, most significant
    first: regressions, improvements, rows it could not judge, passes, context; within each, by
    adjusted p-value (tested rows first), then in the report's order (step time first)."""
    rows = []
    for i, r in enumerate(report.rows):
        verdict = str(r.verdict)
        rows.append(
            {
                "key": r.key,
                "metric": r.label,
                "unit": r.unit,
                "a": value_text(r.baseline, r.unit),
                "b": value_text(r.candidate, r.unit),
                "change": delta_text(r.delta, r.delta_kind),
                "p": "-" if r.p_adjusted is None else f"{r.p_adjusted:.2g}",
                "threshold": r.threshold,
                "verdict": VERDICT_TEXT.get(verdict, verdict),
                "verdict_key": verdict,
                "reason": r.reason,
                "_sort": (
                    VERDICT_RANK.get(verdict, 5),
                    r.p_adjusted if r.p_adjusted is not None else 2.0,
                    i,
                ),
            }
        )
    rows.sort(key=lambda x: x.pop("_sort"))
    return rows


def report(
    con: duckdb.DuckDBPyConnection,
    a_id: int,
    b_id: int,
    analyses: tuple[Analysis | None, Analysis | None] = (None, None),
) -> Any:
    """The report of candidate `b_id` against baseline `a_id` with the default settings (the
    thresholds `tracelab report` uses without a config file). `analyses`: the runner's results
    for A and B when the caller has them cached (otherwise the report runs the analyzers)."""
    from tracelab.report.compare import compare
    from tracelab.report.metrics import extract
    from tracelab.report.thresholds import load_settings

    settings = load_settings(search_dir=None)
    base = extract(con, a_id, settings, analyses[0])
    # A run against itself is extracted once (at 10,000 ranks each extraction is seconds).
    cand = base if b_id == a_id else extract(con, b_id, settings, analyses[1])
    return compare(base, cand, settings)


def finding_changes(a: Analysis, b: Analysis) -> dict[str, list[str]]:
    """Finding titles new in b, gone from a, and in both (by code and ranks)."""

    def keys(x: Analysis) -> dict[tuple[str, tuple[int, ...]], str]:
        return {(f.code, f.evidence.ranks): f"{f.code}: {f.title}" for f in x.findings}

    ka, kb = keys(a), keys(b)
    return {
        "new": [kb[k] for k in kb if k not in ka],
        "resolved": [ka[k] for k in ka if k not in kb],
        "persisting": [kb[k] for k in kb if k in ka],
    }
