"""Step summary: step times per rank, their distribution, and outlier steps.

A rank's step time runs from the start of its ProfilerStep#N span to the later of the span's end
and the end of the device work launched in it (`steps.device_end_ns`), so asynchronous GPU work
counts. The job's step time is the slowest rank's. Outliers are steps slower than the median by
more than `outlier_mad` robust deviations and `outlier_min_ratio`; the first step of a capture
is often one (warm-up). The CI report builds its comparisons on the `steps` table.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import merge_params, ms, r, ranks_str, rows, run_info
from tracelab.results import Evidence, Finding, Result, Severity

NAME = "steps"
TITLE = "Step times"
VIEW = "overview"
DEFAULTS: dict[str, Any] = {
    # A step is an outlier when above median + outlier_mad * 1.4826 * MAD...
    "outlier_mad": 3.5,
    # ...and at least this many times the median.
    "outlier_min_ratio": 1.2,
}


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = run_info(con, run_id)
    per = rows(con, """
        SELECT rank, step, start_ns, greatest(end_ns, coalesce(device_end_ns, end_ns)) AS end_ns,
               end_ns - start_ns AS host_ns,
               greatest(end_ns, coalesce(device_end_ns, end_ns)) - start_ns AS step_ns
        FROM steps WHERE run_id = ? ORDER BY step, rank
        """, [run_id])
    if not per:
        return Result(analyzer=NAME, run=info["name"], params=p, metrics={"steps": 0},
                      notes=("no ProfilerStep#N spans: profile with torch.profiler's schedule "
                             "and call prof.step() each iteration.",))
    job = rows(con, """
        SELECT step, max(greatest(end_ns, coalesce(device_end_ns, end_ns)) - start_ns) AS step_ns,
               min(greatest(end_ns, coalesce(device_end_ns, end_ns)) - start_ns) AS fastest_ns,
               arg_max(rank, greatest(end_ns, coalesce(device_end_ns, end_ns)) - start_ns)
                   AS slowest_rank,
               count(*) AS ranks
        FROM steps WHERE run_id = ? GROUP BY step ORDER BY step
        """, [run_id])
    times = [x["step_ns"] for x in job]
    med = statistics.median(times)
    mad = statistics.median([abs(t - med) for t in times])
    limit = max(med + p["outlier_mad"] * 1.4826 * mad, p["outlier_min_ratio"] * med)
    outliers = [x for x in job if x["step_ns"] > limit]
    rank_stats = []
    for rk in sorted({x["rank"] for x in per}):
        ts = [x["step_ns"] for x in per if x["rank"] == rk]
        rank_stats.append({
            "rank": rk, "steps": len(ts), "median_ms": ms(statistics.median(ts)),
            "mean_ms": ms(statistics.mean(ts)), "min_ms": ms(min(ts)), "max_ms": ms(max(ts)),
            "std_ms": ms(statistics.pstdev(ts)) if len(ts) > 1 else 0.0})
    srt = sorted(times)
    metrics = {
        "steps": len(job), "ranks": len(rank_stats),
        "step_ms_median": ms(med), "step_ms_mean": ms(statistics.mean(times)),
        "step_ms_min": ms(srt[0]), "step_ms_max": ms(srt[-1]),
        "step_ms_p90": ms(srt[min(len(srt) - 1, int(0.9 * len(srt)))]),
        "step_ms_cv": r(statistics.pstdev(times) / statistics.mean(times)) if len(times) > 1 else 0.0,
        "rank_spread_ms_median": ms(statistics.median(x["step_ns"] - x["fastest_ns"] for x in job)),
        "outlier_steps": [x["step"] for x in outliers],
    }
    findings = []
    if outliers and len(job) >= 3:
        lost = sum(x["step_ns"] - med for x in outliers) / len(job)
        worst = max(outliers, key=lambda x: x["step_ns"])
        findings.append(Finding(
            code="STEP_TIME_OUTLIER", severity=Severity.INFO if outliers[0]["step"] == job[0][
                "step"] and len(outliers) == 1 else Severity.WARNING,
            title=f"{len(outliers)} of {len(job)} steps are outliers (up to "
                  f"{worst['step_ns'] / med:.2f}x the median {ms(med)} ms)",
            evidence=Evidence(
                ranks=tuple(sorted({x["slowest_rank"] for x in outliers})),
                steps=tuple(x["step"] for x in outliers),
                time_ranges_ns=tuple((s["start_ns"], s["end_ns"]) for s in per
                                     if s["rank"] == worst["slowest_rank"]
                                     and s["step"] == worst["step"]),
                numbers={"median_step_ms": ms(med), "worst_step_ms": ms(worst["step_ns"]),
                         "threshold_ms": ms(limit)}),
            impact_ms_per_step=ms(lost), impact_share=r(lost / med) if med else None,
            suggestion="If it is the first profiled step, it is warm-up (allocator, autotuning, "
                       "compilation): profile with warmup >= 1 and leave it out of comparisons. "
                       "Otherwise look at the slow steps' timeline on "
                       f"{ranks_str(sorted({x['slowest_rank'] for x in outliers}))}: "
                       "data loading, checkpointing, garbage collection or recompilation.",
            analyzer=NAME, view="overview"))
    steps_tbl = [{"rank": x["rank"], "step": x["step"], "start_ns": x["start_ns"],
                  "step_ms": ms(x["step_ns"]), "host_ms": ms(x["host_ns"])} for x in per]
    job_tbl = [{"step": x["step"], "step_ms": ms(x["step_ns"]), "fastest_ms": ms(x["fastest_ns"]),
                "slowest_rank": x["slowest_rank"], "ranks": x["ranks"],
                "outlier": x["step_ns"] > limit} for x in job]
    return Result(analyzer=NAME, run=info["name"], params=p, metrics=metrics,
                  tables={"steps": steps_tbl, "job_steps": job_tbl, "ranks": rank_stats},
                  findings=tuple(findings))
