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
import numpy as np

from tracelab.analyzers._collectives import cached_matched
from tracelab.analyzers._common import merge_params, ms, run_info
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
    on the aligned clock (cached_matched), whose start_ns is the raw arrival. numpy over the
    matched rows: a self-join with a median per row costs DuckDB tens of milliseconds."""
    t = con.sql(f"SELECT rank, key, start_ns, a_ns, e_ns, last_arrival_ns FROM {matched}"
                ).to_arrow_table()
    if not t.num_rows:
        return {}
    code = t.column("key").combine_chunks().dictionary_encode().indices.to_numpy()
    rank = t.column("rank").to_numpy().astype(np.int64, copy=False)
    margin = np.array([2 * unc.get(int(rk), 0) for rk in rank], dtype=np.int64)
    bad = t.column("e_ns").to_numpy() < t.column("last_arrival_ns").to_numpy() - margin
    raw = _median_vs_others(code, t.column("start_ns").to_numpy())
    aligned = _median_vs_others(code, t.column("a_ns").to_numpy())
    out = {}
    for rk in np.unique(rank):
        mine = rank == rk
        out[int(rk)] = {"rank": int(rk), "raw_skew_ns": _median(raw[mine]),
                        "skew_ns": _median(aligned[mine]),
                        "violations": int(bad[mine].sum()), "matches": int(mine.sum())}
    return out


def _median_vs_others(group: np.ndarray, v: np.ndarray) -> np.ndarray:
    """For each row, the median over the other rows of its group of (v[row] - v[other]), as
    DuckDB's median of integers gives it (the lower middle plus half the distance to the
    upper). Rows alone in their group get NaN."""
    order = np.lexsort((v, group))
    g, vs = group[order], v[order].astype(np.int64, copy=False)
    cnt = np.bincount(g)
    first = np.cumsum(cnt) - cnt
    pos = np.arange(len(g)) - first[g]
    n = cnt[g]
    m = n - 1  # others

    def other(i: np.ndarray) -> np.ndarray:
        # The i-th smallest of the others: skip the row itself.
        return vs[first[g] + i + (i >= pos)]

    res = np.full(len(g), np.nan)
    ok = m >= 1
    hi_i = np.where(ok, m // 2, 0)
    lo_i = np.where(ok, (m - 1) // 2, 0)
    # Differences v - other sort the others in reverse: the lower middle difference comes
    # from the upper middle other.
    lo_d = vs - other(hi_i)
    hi_d = vs - other(lo_i)
    res[ok] = (lo_d + (hi_d - lo_d) * 0.5)[ok]
    out = np.empty_like(res)
    out[order] = res
    return out


def _median(x: np.ndarray) -> float | None:
    """DuckDB's median of doubles (NaN rows left out): lower middle plus half the distance."""
    x = np.sort(x[~np.isnan(x)])
    if not len(x):
        return None
    lo, hi = x[(len(x) - 1) // 2], x[len(x) // 2]
    return float(lo + (hi - lo) * 0.5)


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
