"""Clock alignment: each rank's offset to the reference rank, how sure it is, and what it hides.

The offsets are the derived layer's (clock_offsets: the collector's exchange, one host's shared
clock, or causality bounds over matched collectives; docs/metrics.md). Every analyzer compares
ranks on that aligned clock, and none blames lateness within the uncertainty reported here.
Skew: per rank, the median over matched collectives of its arrival minus the median arrival of
the others, before and after alignment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import RunContext, merge_params, ms, ranks_str, rows
from tracelab.derived.sqlrows import first
from tracelab.results import Evidence, Finding, Result, Severity
from tracelab.vocabulary import Code

NAME = "clocks"
TITLE = "Clock alignment"
VIEW = "stragglers"
DEFAULTS: dict[str, Any] = {
    # Report CLOCK_UNCERTAIN when an estimated offset is uncertain by more than this (ns).
    "uncertainty_threshold_ns": 500_000,
    # Report CLOCK_SKEW (information) when an applied offset exceeds this (ns).
    "skew_threshold_ns": 500_000,
}


def _others_median(col: str) -> str:
    """SQL over `g` joined to `w`: the median of the match's `col` values without this row's
    (NULL when it is alone). The others' j-th smallest is the match's j-th if j < this row's
    position, else its (j+1)-th, so four order statistics per match give it for every row."""
    lo = f"(CASE WHEN g.lo < w.pos_{col} THEN g.{col}_lo ELSE g.{col}_lo1 END)"
    hi = f"(CASE WHEN g.hi < w.pos_{col} THEN g.{col}_hi ELSE g.{col}_hi1 END)"
    return f"(CASE WHEN g.n > 1 THEN ({lo} + {hi}) / 2 END)"


def _stats(col: str) -> str:
    return ", ".join(
        f"max({col}) FILTER (WHERE pos_{col} = {k}) AS {col}_{name}"
        for name, k in (("lo", "lo"), ("lo1", "lo + 1"), ("hi", "hi"), ("hi1", "hi + 1"))
    )


#: Per rank, clocks plus the median over its matches of (its arrival - the median arrival of
#: the other ranks of the match), on its own clock (raw) and aligned. Linear in matched rows.
_RANKS_SQL = f"""
WITH m AS (
    SELECT m.match_key, m.rank, m.start_ns AS aligned, m.start_ns + o.offset_ns AS raw
    FROM matched_collectives m JOIN clock_offsets o USING (run_id, rank)
    WHERE m.run_id = $run
),
w AS (
    SELECT *, row_number() OVER (PARTITION BY match_key ORDER BY raw) - 1 AS pos_raw,
           row_number() OVER (PARTITION BY match_key ORDER BY aligned) - 1 AS pos_aligned,
           count(*) OVER (PARTITION BY match_key) AS n
    FROM m
),
b AS (SELECT *, (n - 2) // 2 AS lo, (n - 1) // 2 AS hi FROM w),
g AS (SELECT match_key, any_value(n) AS n, any_value(lo) AS lo, any_value(hi) AS hi,
             {_stats("raw")}, {_stats("aligned")}
      FROM b GROUP BY match_key),
pairs AS (
    SELECT w.rank, w.raw - {_others_median("raw")} AS raw_skew,
           w.aligned - {_others_median("aligned")} AS skew
    FROM w JOIN g USING (match_key)
),
sk AS (SELECT rank, median(raw_skew) AS raw_skew_ns, median(skew) AS skew_ns FROM pairs
       GROUP BY rank)
SELECT o.rank, o.host, o.method, o.offset_ns, o.uncertainty_ns, o.matches,
       o.causality_violations, sk.raw_skew_ns, sk.skew_ns
FROM clock_offsets o LEFT JOIN sk USING (rank)
WHERE o.run_id = $run ORDER BY o.rank
"""


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    table = rows(con, _RANKS_SQL, {"run": ctx.run_id})
    if not table:
        why = ctx.derived_errors.get("clocks", "the run has no ranks")
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"methods": []},
            notes=(f"no clock offsets: {why}.",),
        )
    known = [x["uncertainty_ns"] for x in table if x["uncertainty_ns"] is not None]
    violations = sum(x["causality_violations"] for x in table)
    ref = first(
        con.execute(
            "SELECT any_value(reference_rank) FROM clock_offsets WHERE run_id = ?", [ctx.run_id]
        )
    )
    metrics = {
        "reference_rank": ref[0] if ref else None,
        "methods": sorted({x["method"] for x in table}),
        "hosts": len({x["host"] for x in table if x["host"] is not None}),
        "offset_ns_max_abs": max(abs(x["offset_ns"]) for x in table),
        "uncertainty_ns_max": max(known) if known else None,
        "causality_violations": violations,
    }
    findings = []
    uncertain = [
        x
        for x in table
        if x["method"] == "collectives"
        and (x["uncertainty_ns"] or 0) > p["uncertainty_threshold_ns"]
    ]
    if uncertain or violations:
        worst = max((x["uncertainty_ns"] or 0 for x in uncertain), default=0)
        findings.append(
            Finding(
                code=Code.CLOCK_UNCERTAIN,
                severity=Severity.WARNING,
                title=(
                    f"Clocks of {ranks_str([x['rank'] for x in uncertain])} on other hosts are "
                    f"known only to within {ms(worst)}"
                    if uncertain
                    else f"{violations} collectives break causality after clock alignment"
                ),
                evidence=Evidence(
                    ranks=tuple(
                        x["rank"]
                        for x in (uncertain or table)
                        if uncertain or x["causality_violations"]
                    ),
                    numbers={"uncertainty_ns_max": worst, "causality_violations": violations},
                ),
                suggestion="Lateness below this uncertainty is not blamed on any rank. Capture with "
                "tracelab.profile, whose clock exchange measures offsets to microseconds, "
                "or sync the hosts with PTP/chrony before profiling."
                + (
                    " Violations mean a clock drifted during the capture: profile shorter windows."
                    if violations
                    else ""
                ),
                analyzer=NAME,
                view="stragglers",
            )
        )
    skewed = [x for x in table if abs(x["offset_ns"]) > p["skew_threshold_ns"]]
    if skewed:
        worst_row = max(skewed, key=lambda x: abs(x["offset_ns"]))
        findings.append(
            Finding(
                code=Code.CLOCK_SKEW,
                severity=Severity.INFO,
                title=f"Rank clocks disagree by up to {ms(worst_row['offset_ns'])} (rank "
                f"{worst_row['rank']}); corrected before ranks are compared",
                evidence=Evidence(
                    ranks=tuple(x["rank"] for x in skewed),
                    numbers={
                        "offset_ns": worst_row["offset_ns"],
                        "raw_skew_ns": worst_row["raw_skew_ns"],
                        "aligned_skew_ns": worst_row["skew_ns"],
                        "method": worst_row["method"],
                    },
                ),
                suggestion="Uncorrected, these ranks would look early or late at every collective "
                "(false stragglers). Nothing to fix in training; keep host clocks in "
                "sync for captures that other tools read.",
                analyzer=NAME,
                view="stragglers",
            )
        )
    notes = []
    if any(x["method"] == "none" for x in table):
        notes.append(
            "some ranks share no matched collective with the reference rank and no "
            "host with it: their offsets are unknown and taken as 0."
        )
    if any(x["method"] == "same_host" for x in table):
        notes.append("ranks on the reference rank's host share its clock (offset 0).")
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"ranks": table},
        findings=tuple(findings),
        notes=tuple(notes),
    )
