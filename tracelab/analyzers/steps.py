"""Step times: the job's step time over the steady state, its spread, and outlier steps.

Steps are the derived layer's (step_spans: ProfilerStep spans extended to the device work they
launched and tiled back to back; docs/metrics.md). The job's time for a step is its ranks'
mean (steps tile every rank's run); the headline `step_ns` is its mean over the
steady-state steps, the same figure as the lost-time budget's step (every surface shows it as
"step time"); the median and spread are beside it. An outlier is a step slower
than the median of all steps by more than `outlier_mad` robust deviations and by at least
`outlier_min_ratio`; the first step of a capture is often one (warm-up). An outlier costs no
time of its own in the lost-time budget: its time is already in its parts (host, compute,
waiting), which the other findings claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import RunContext, merge_params, ms, ranks_str, rows
from tracelab.derived.sqlrows import first
from tracelab.results import Evidence, Finding, Result, Severity
from tracelab.vocabulary import Code

NAME = "steps"
TITLE = "Step times"
VIEW = "overview"
DEFAULTS: dict[str, Any] = {
    # A step is an outlier when above median + outlier_mad * 1.4826 * MAD...
    "outlier_mad": 3.5,
    # ...and at least this many times the median.
    "outlier_min_ratio": 1.2,
}

_STATS_SQL = """
SELECT count(*) AS steps,
       (SELECT avg(dur_ns) FROM step_spans
        WHERE run_id = $run AND ordinal >= $min_ordinal) AS step_ns,
       median(dur_ns) AS step_ns_median, avg(dur_ns) AS step_ns_mean,
       min(dur_ns) AS step_ns_min, max(dur_ns) AS step_ns_max,
       quantile_cont(dur_ns, 0.9) AS step_ns_p90,
       CASE WHEN count(*) > 1 THEN stddev_pop(dur_ns) / avg(dur_ns) ELSE 0 END AS step_cv,
       median(dur_ns - fastest_ns) AS rank_spread_ns_median
FROM job_steps WHERE run_id = $run AND ordinal >= $min_ordinal
"""

_OUTLIER_SQL = """
WITH j AS (SELECT * FROM job_steps WHERE run_id = $run),
m AS (SELECT median(dur_ns) AS med FROM j),
d AS (SELECT mad(dur_ns) AS mad FROM j)
SELECT j.step, j.ordinal, j.dur_ns, j.slowest_rank, j.start_ns, j.end_ns, m.med,
       greatest(m.med + $k * 1.4826 * d.mad, $ratio * m.med) AS limit_ns
FROM j, m, d ORDER BY j.step
"""

_RANKS_SQL = """
SELECT rank, count(*) AS steps, median(dur_ns) AS step_ns_median, avg(dur_ns) AS step_ns_mean,
       min(dur_ns) AS step_ns_min, max(dur_ns) AS step_ns_max,
       CASE WHEN count(*) > 1 THEN stddev_pop(dur_ns) ELSE 0 END AS step_ns_std
FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal GROUP BY rank ORDER BY rank
"""


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    job = rows(
        con,
        _OUTLIER_SQL,
        {"run": ctx.run_id, "k": p["outlier_mad"], "ratio": p["outlier_min_ratio"]},
    )
    if not job:
        why = ctx.derived_errors.get("steps", "the run has no steps")
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"steps": 0},
            notes=(f"no steps: {why}.",),
        )
    stats = rows(con, _STATS_SQL, ctx.params)[0]
    source = first(
        con.execute("SELECT any_value(source) FROM step_spans WHERE run_id = ?", [ctx.run_id])
    )
    outliers = [x for x in job if x["dur_ns"] > x["limit_ns"]]
    metrics: dict[str, Any] = {
        "steps": len(job),
        "steady_steps": stats["steps"],
        "warmup_steps": ctx.min_ordinal,
        "ranks": ctx.rank_count,
        **{
            k: stats[k]
            for k in (
                "step_ns",
                "step_ns_median",
                "step_ns_mean",
                "step_ns_min",
                "step_ns_max",
                "step_ns_p90",
                "step_cv",
                "rank_spread_ns_median",
            )
        },
        "outlier_steps": [x["step"] for x in outliers],
        "step_source": source[0] if source else None,
    }
    findings = []
    if outliers and len(job) >= 3:
        worst = max(outliers, key=lambda x: x["dur_ns"])
        med = worst["med"]
        warmup_only = all(x["ordinal"] < ctx.min_ordinal for x in outliers)
        culprits = sorted({x["slowest_rank"] for x in outliers})
        findings.append(
            Finding(
                code=Code.STEP_TIME_OUTLIER,
                severity=Severity.INFO if warmup_only else Severity.WARNING,
                title=f"{len(outliers)} of {len(job)} steps are outliers (up to "
                f"{worst['dur_ns'] / med:.2f}x the median {ms(med)})"
                + (": warm-up, left out of the steady state" if warmup_only else ""),
                evidence=Evidence(
                    ranks=tuple(culprits),
                    steps=tuple(x["step"] for x in outliers),
                    time_ranges_ns=((worst["start_ns"], worst["end_ns"]),),
                    numbers={
                        "median_step_ns": med,
                        "worst_step_ns": worst["dur_ns"],
                        "threshold_ns": worst["limit_ns"],
                        "extra_ns_per_step": sum(x["dur_ns"] - med for x in outliers) / len(job),
                    },
                ),
                suggestion=(
                    "These are the warm-up steps (allocator, autotuning, compilation); they "
                    "are left out of every steady-state figure."
                    if warmup_only
                    else "Look at the slow steps' timeline on "
                    + ranks_str(culprits)
                    + ": data loading, checkpointing, garbage collection or recompilation. "
                    "Their time is counted in the parts of those steps, which the other "
                    "findings claim."
                ),
                analyzer=NAME,
                view="timeline",
            )
        )
    ranks_tbl = rows(con, _RANKS_SQL, ctx.params)
    steps_tbl = rows(
        con,
        """SELECT rank, step, ordinal, steady, start_ns, end_ns, dur_ns,
                                    host_end_ns - host_start_ns AS host_ns, source
                             FROM step_spans WHERE run_id = ? ORDER BY step, rank""",
        [ctx.run_id],
    )
    job_tbl = [
        {
            "step": x["step"],
            "ordinal": x["ordinal"],
            "dur_ns": x["dur_ns"],
            "slowest_rank": x["slowest_rank"],
            "start_ns": x["start_ns"],
            "end_ns": x["end_ns"],
            "steady": x["ordinal"] >= ctx.min_ordinal,
            "outlier": x["dur_ns"] > x["limit_ns"],
        }
        for x in job
    ]
    notes: tuple[str, ...] = ()
    if metrics["step_source"] == "whole_trace":
        notes = (
            "the trace has no ProfilerStep#N spans: it is analysed as one step over the "
            "whole trace. Profile with torch.profiler's schedule and call prof.step() "
            "each iteration for per-step figures.",
        )
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"steps": steps_tbl, "job_steps": job_tbl, "ranks": ranks_tbl},
        findings=tuple(findings),
        notes=notes,
    )
