"""Clock alignment: each rank's offset to the reference rank, how sure we are, and what it hides.

Offsets come from the collector's NTP-style clock exchange when the capture has one; ranks on a
single named host share one clock; otherwise they are estimated from matched collectives
(median of end_r - end_ref, FACTS.md section 3). Every other analyzer aligns times the same way
(tracelab.analyzers._collectives.estimate_clocks), and none blames a rank for lateness within the
uncertainty reported here. The causality check counts matched collectives that, after alignment,
end on some rank before the last rank arrived, beyond the uncertainty: a sign the offsets are
wrong or drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._collectives import cached_matched, offsets_relation
from tracelab.analyzers._common import merge_params, ms, rows, run_info
from tracelab.results import Evidence, Finding, Result, Severity

NAME = "clocks"
TITLE = "Clock alignment"
VIEW = "stragglers"
DEFAULTS: dict[str, Any] = {
    # Report CLOCK_UNCERTAIN when a rank's offset is uncertain by more than this.
    "uncertainty_threshold_ms": 0.5,
    # Report CLOCK_SKEW (information) when an applied offset exceeds this.
    "skew_threshold_ms": 0.5,
}


def _skew(con: duckdb.DuckDBPyConnection, matched: str,
          unc: dict[int, int]) -> dict[int, dict[str, Any]]:
    """Per rank: median arrival skew against the other ranks' median, raw and aligned, and the
    number of causality violations after alignment. `matched`: the run's matched collectives
    on the aligned clock (cached_matched), whose start_ns is the raw arrival."""
    u_rel, u_p = offsets_relation(unc)
    got = rows(con, f"""
        WITH u AS {u_rel},
        pm AS (SELECT x.rank, median(x.start_ns - o.start_ns) AS raw_skew,
                      median(x.a_ns - o.a_ns) AS skew,
                      any_value(x.e_ns < x.last_arrival_ns - 2 * coalesce(uu.off_ns, 0)) AS bad
               FROM {matched} x JOIN {matched} o ON o.key = x.key AND o.rank <> x.rank
               LEFT JOIN u uu ON uu.rank = x.rank
               GROUP BY x.rank, x.key, x.a_ns)
        SELECT rank, median(raw_skew) AS raw_skew_ns, median(skew) AS skew_ns,
               count(*) FILTER (WHERE bad) AS violations, count(*) AS matches
        FROM pm GROUP BY rank
        """, u_p)
    return {int(x["rank"]): x for x in got}


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = run_info(con, run_id)
    matched, est = cached_matched(con, run_id)
    source = est.source
    skew = _skew(con, matched, est.uncertainty_ns) if matched else {}
    hosts = dict(con.execute("SELECT rank, host FROM ranks WHERE run_id = ?", [run_id]).fetchall())
    table: list[dict[str, Any]] = []
    for rk in sorted(est.offsets_ns):
        sk = skew.get(rk, {})
        table.append({
            "rank": rk, "host": hosts.get(rk), "method": est.method[rk],
            "offset_ms": ms(est.offsets_ns[rk], 6), "uncertainty_ms": ms(est.uncertainty_ns[rk], 6),
            "raw_skew_ms": ms(sk.get("raw_skew_ns"), 6), "aligned_skew_ms": ms(sk.get("skew_ns"), 6),
            "causality_violations": sk.get("violations"), "matches": sk.get("matches")})
    violations = sum(x["causality_violations"] or 0 for x in table)
    max_unc = max((x["uncertainty_ms"] or 0 for x in table), default=0.0)
    metrics = {
        "reference_rank": est.reference_rank, "source": source,
        "methods": sorted(set(est.method.values())),
        "offset_ms_max_abs": max((abs(x["offset_ms"] or 0) for x in table), default=0.0),
        "uncertainty_ms_max": max_unc, "causality_violations": violations,
    }
    findings = []
    uncertain = [x["rank"] for x in table if (x["uncertainty_ms"] or 0) > p["uncertainty_threshold_ms"]]
    if uncertain or violations:
        findings.append(Finding(
            code="CLOCK_UNCERTAIN", severity=Severity.WARNING,
            title=f"Clock alignment is uncertain by up to {max_unc:.3f} ms"
                  + (f"; {violations} collectives break causality after alignment"
                     if violations else ""),
            evidence=Evidence(ranks=tuple(uncertain or [x["rank"] for x in table
                                                        if x["causality_violations"]]),
                              numbers={"uncertainty_ms_max": max_unc,
                                       "causality_violations": violations}),
            impact_ms_per_step=None, impact_share=None,
            suggestion="Lateness below this uncertainty is not attributed to any rank. Capture "
                       "with tracelab.profile, whose clock exchange measures offsets to "
                       "microseconds, or sync the hosts with PTP/chrony before profiling.",
            analyzer=NAME, view="stragglers"))
    skewed = [x for x in table if abs(x["offset_ms"] or 0) > p["skew_threshold_ms"]]
    if skewed:
        worst = max(skewed, key=lambda x: abs(x["offset_ms"]))
        findings.append(Finding(
            code="CLOCK_SKEW", severity=Severity.INFO,
            title=f"Rank clocks disagree by up to {worst['offset_ms']:+.3f} ms (rank "
                  f"{worst['rank']}); corrected before comparing ranks",
            evidence=Evidence(ranks=tuple(x["rank"] for x in skewed), numbers={
                "offset_ms": worst["offset_ms"], "raw_skew_ms": worst["raw_skew_ms"],
                "aligned_skew_ms": worst["aligned_skew_ms"], "method": worst["method"]}),
            impact_ms_per_step=None, impact_share=None,
            suggestion="Uncorrected, these ranks would look early or late at every collective "
                       "(false stragglers). Nothing to fix in training; keep host clocks in "
                       "sync for captures that other tools read.",
            analyzer=NAME, view="stragglers"))
    notes = [] if source else ["no collectives matched across ranks: offsets come only from "
                               "the capture or a shared host."]
    return Result(analyzer=NAME, run=info["name"], params=p, metrics=metrics,
                  tables={"ranks": table}, findings=tuple(findings), notes=tuple(notes))
