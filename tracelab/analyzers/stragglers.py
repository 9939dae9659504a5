"""Stragglers: who makes the others wait at collectives, why, and what it costs per step.

Collectives are matched across ranks (tracelab.analyzers._collectives) on the aligned clock. For
each match: arrival a_r, last arrival A, wait_r = A - a_r, transfer = the shortest duration (no
clock needed), and the last arriver's lateness = A - the second-latest arrival. A rank is blamed
when it is the last arriver, later than the clock uncertainty allows, in at least `min_share` of
the matches. It is a *compute* straggler when the compute it did since its previous collective
exceeds its peers' median by at least half its lateness, else a *communication* straggler (late
without more compute: its previous communication, a launch delay or host work held it back).

What-if (Lin et al., OSDI 2025): per step, each rank's time before each collective (its "gap")
and after the last one is replayed through the matched collectives; with a rank's gaps set to the
median across ranks, the replay gives the step time had it run at the median speed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import duckdb
import numpy as np

from tracelab.analyzers import _intervals as iv
from tracelab.analyzers._collectives import (
    choose_source,
    estimate_clocks,
    matched_sql,
    offsets_relation,
)
from tracelab.analyzers._common import NS_PER_MS, merge_params, ms, r, rows, run_info
from tracelab.analyzers.breakdown import cached_intervals
from tracelab.results import Evidence, Finding, Result, Severity

NAME = "stragglers"
TITLE = "Stragglers at collectives"
VIEW = "stragglers"
DEFAULTS: dict[str, Any] = {
    # Blame a rank that is the (blameable) last arriver in at least this share of matches.
    "min_share": 0.5,
    # ...and whose what-if saving is at least this share of the step.
    "min_saving_share": 0.01,
}


def _gaps(con: duckdb.DuckDBPyConnection, run_id: int, source: str,
          offsets: dict[int, int]) -> list[dict[str, Any]]:
    """Matched rows plus each rank's gap since its previous collective (or its step start)
    and the compute inside that gap, all aligned."""
    rel, rel_params = offsets_relation(offsets)
    _, seg = cached_intervals(con, run_id)
    spans = f"""
        WITH mt AS ({matched_sql(rel)}),
        off AS {rel},
        st AS (SELECT s.rank, s.step, s.start_ns - coalesce(o.off_ns, 0) AS s0,
                      greatest(s.end_ns, coalesce(s.device_end_ns, s.end_ns))
                        - coalesce(o.off_ns, 0) AS s1
               FROM steps s LEFT JOIN off o USING (rank) WHERE s.run_id = ?),
        g AS (SELECT mt.*, st.s0 AS step0, st.s1 AS step1,
                     coalesce(lag(e_ns) OVER (PARTITION BY mt.rank, mt.step ORDER BY a_ns),
                              least(st.s0, a_ns)) AS prev_ns
              FROM mt LEFT JOIN st ON st.rank = mt.rank AND st.step = mt.step)
        -- The gap on the rank's own clock (raw), where its compute intervals live.
        SELECT g.*, greatest(a_ns - prev_ns, 0) AS gap_ns,
               prev_ns + (start_ns - a_ns) AS s0, start_ns AS s1
        FROM g"""
    return rows(con, f"""
        SELECT *,
               -- The last arriver's lateness over the next-latest, and its peers' compute.
               max(a_ns) FILTER (WHERE rank <> last_rank) OVER k AS second_ns,
               median(compute_ns) FILTER (WHERE rank <> last_rank) OVER k AS peer_compute_ns,
               round(wait_ns / 1e6, 4) AS wait_ms, round(gap_ns / 1e6, 4) AS gap_ms,
               round(compute_ns / 1e6, 4) AS compute_ms
        FROM (SELECT rank, key, op, step, a_ns, e_ns, n, last_arrival_ns, last_rank,
                     transfer_ns, wait_ns, step0 AS s0, step1 AS s1, prev_ns, gap_ns,
                     greatest(covered_ns, 0) AS compute_ns
              FROM ({iv.spans_covered_sql(seg, spans, "compute")}))
        WINDOW k AS (PARTITION BY key)
        ORDER BY step, last_arrival_ns, rank
        """, [run_id, source, *rel_params, *rel_params, run_id])


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = run_info(con, run_id)
    clocks = estimate_clocks(con, run_id)
    source = choose_source(con, run_id)
    data = _gaps(con, run_id, source, clocks.offsets_ns) if source else []
    if not data:
        return Result(analyzer=NAME, run=info["name"], params=p, metrics={"matched": 0},
                      notes=("no collective is matched across two or more ranks: nothing to "
                             "compare (single-rank trace, or no timed collectives).",))
    unc = clocks.uncertainty_ns
    ranks_of: dict[str, list[int]] = {}
    for x in data:
        ranks_of.setdefault(x["key"], []).append(x["rank"])
    # Never blame lateness within the clocks' uncertainty: the last rank's plus its peers'.
    margin_of = {rk: u + max((v for o, v in unc.items() if o != rk), default=0)
                 for rk, u in unc.items()}
    per_match = []
    for x in data:
        if x["rank"] != x["last_rank"]:
            continue
        late = x["a_ns"] - x["second_ns"]
        margin = margin_of.get(x["rank"], 0)
        per_match.append({
            "key": x["key"], "op": x["op"], "step": x["step"], "last_rank": x["rank"],
            "lateness_ns": late, "blameable": late > margin, "margin_ns": margin,
            "transfer": x["transfer_ns"], "A": x["last_arrival_ns"],
            "ranks": sorted(ranks_of[x["key"]]),
            "extra_compute_ns": x["compute_ns"] - x["peer_compute_ns"]})
    per_match.sort(key=lambda m: (m["step"] if m["step"] is not None else -1, m["A"]))
    steps_out, savings = _whatif(per_match, data)
    rank_rows, blamed = _rank_table(p, per_match, data, savings, steps_out)
    findings = _findings(blamed, rank_rows, per_match, steps_out)
    slow = [s["slowdown"] for s in steps_out if s["slowdown"] is not None]
    metrics = {
        "source": source, "matched": len(per_match), "ranks": len({x["rank"] for x in data}),
        "clock_uncertainty_ms_max": ms(max(unc.values(), default=0)),
        "blameable_share": r(sum(m["blameable"] for m in per_match) / len(per_match)),
        "transfer_ms_median": ms(statistics.median(m["transfer"] for m in per_match)),
        "step_ms_median": r(statistics.median([s["step_ms"] for s in steps_out])) if steps_out else None,
        "ideal_step_ms_median": r(statistics.median([s["ideal_step_ms"] for s in steps_out]))
        if steps_out else None,
        "slowdown_median": r(statistics.median(slow)) if slow else None,
        "stragglers": sorted(blamed),
    }
    step_ranks = _step_ranks(per_match, data)
    last_of: dict[Any, tuple[int, int | None]] = {}
    for x in step_ranks:
        if x["times_last"] and x["times_last"] >= last_of.get(x["step"], (0, None))[0]:
            last_of[x["step"]] = (x["times_last"], x["rank"])
    for s in steps_out:
        s["last_arriver"] = last_of.get(s["step"], (0, None))[1]
    coll_rows = [{"key": m["key"], "op": m["op"], "step": m["step"], "last_rank": m["last_rank"],
                  "lateness_ms": ms(m["lateness_ns"]), "transfer_ms": ms(m["transfer"]),
                  "blameable": m["blameable"], "last_arrival_ns": m["A"]} for m in per_match]
    waits = [{"key": x["key"], "rank": x["rank"], "step": x["step"], "wait_ms": x["wait_ms"],
              "arrival_ns": x["a_ns"], "end_ns": x["e_ns"], "gap_ms": x["gap_ms"],
              "compute_ms": x["compute_ms"]} for x in data]
    return Result(analyzer=NAME, run=info["name"], params=p, metrics=metrics,
                  tables={"ranks": rank_rows, "steps": steps_out, "step_ranks": step_ranks,
                          "collectives": coll_rows,
                          "waits": waits}, findings=tuple(findings),
                  notes=(f"collectives from source '{source}', clocks aligned by "
                         f"{', '.join(sorted(set(clocks.method.values())))}; lateness within "
                         "the clock uncertainty is never blamed.",))


def _step_ranks(per_match: list[dict[str, Any]],
                data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step and rank: compute before its collectives, time waiting in them, and how often
    it was the (blameable) last to arrive."""
    out: dict[tuple[Any, int], dict[str, Any]] = {}
    for x in data:
        row = out.setdefault((x["step"], x["rank"]), {"step": x["step"], "rank": x["rank"],
                                                      "compute_ns": 0, "wait_ns": 0,
                                                      "times_last": 0})
        row["compute_ns"] += x["compute_ns"]
        row["wait_ns"] += x["wait_ns"]
    for m in per_match:
        if m["blameable"] and (m["step"], m["last_rank"]) in out:
            out[(m["step"], m["last_rank"])]["times_last"] += 1
    return [{"step": v["step"], "rank": v["rank"], "compute_ms": ms(v["compute_ns"]),
             "wait_ms": ms(v["wait_ns"]), "times_last": v["times_last"]}
            for _, v in sorted(out.items(), key=lambda kv: (kv[0][0] is None, kv[0]))]


def _whatif(per_match: list[dict[str, Any]],
            data: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, list[float]]]:
    """Per step: measured and replayed step time, all-ranks-at-median ideal, and per rank the
    saving had that rank alone run at the median. The replay walks the step's matched
    collectives in order; numpy carries all the variants (actual, ideal, each rank alone at
    the median) through one walk."""
    rows_of: dict[Any, list[dict[str, Any]]] = {}
    for x in data:
        rows_of.setdefault(x["step"], []).append(x)
    matches_of: dict[Any, list[dict[str, Any]]] = {}
    for m in per_match:
        matches_of.setdefault(m["step"], []).append(m)
    out: list[dict[str, Any]] = []
    savings: dict[int, list[float]] = {}
    for step, mlist in matches_of.items():
        rws = rows_of.get(step, [])
        firsts = [min(x["s0"], x["prev_ns"]) for x in rws if x["s0"] is not None]
        if step is None or not firsts:
            continue
        # Rebase to the step's first start: absolute ns do not fit a float exactly.
        base = min(firsts)
        start: dict[int, float] = {}
        last_end: dict[int, int] = {}
        step_end: dict[int, int] = {}
        for x in rws:
            if x["s0"] is not None:
                start[x["rank"]] = float(min(x["s0"], x["prev_ns"]) - base)
            last_end[x["rank"]] = max(last_end.get(x["rank"], base), x["e_ns"])
            if x["s1"] is not None:
                step_end[x["rank"]] = x["s1"]
        ranks = sorted(start)
        col = {rk: i for i, rk in enumerate(ranks)}
        mlist = [m for m in mlist if all(rk in col for rk in m["ranks"])]
        if not mlist:
            continue
        row = {m["key"]: k for k, m in enumerate(mlist)}
        gaps = np.full((len(mlist), len(ranks)), np.nan)
        for x in rws:
            if x["key"] in row and x["rank"] in col:
                gaps[row[x["key"]], col[x["rank"]]] = float(x["gap_ns"])
        part = ~np.isnan(gaps)
        med = np.nanmedian(gaps, axis=1)
        tail = np.array([float(max(0, step_end[rk] - last_end[rk])) if rk in step_end else 0.0
                         for rk in ranks])
        med_tail = float(np.median(tail[[rk in step_end for rk in ranks]])) if step_end else 0.0
        # Variants: 0 actual, 1 every rank at the median, 2 + i rank i alone at the median.
        nv = 2 + len(ranks)
        g = np.repeat(gaps[None], nv, axis=0)
        tl = np.repeat(tail[None], nv, axis=0)
        g[1] = np.where(part, med[:, None], np.nan)
        tl[1] = np.where([rk in step_end for rk in ranks], med_tail, 0.0)
        for i, rk in enumerate(ranks):
            g[2 + i][:, i] = np.where(part[:, i], med, np.nan)
            if rk in step_end:
                tl[2 + i][i] = med_tail
        transfer = np.array([float(m["transfer"]) for m in mlist])
        t = np.tile(np.array([start[rk] for rk in ranks]), (nv, 1))
        for k in range(len(mlist)):
            cols = part[k]
            arrive = (t[:, cols] + g[:, k, cols]).max(axis=1)
            t[:, cols] = (arrive + transfer[k])[:, None]
        total = (t + tl).max(axis=1) - min(start.values())
        actual, ideal = float(total[0]), float(total[1])
        for i, rk in enumerate(ranks):
            savings.setdefault(rk, []).append(actual - float(total[2 + i]))
        measured = max(step_end.values()) - base if step_end else None
        out.append({"step": step, "step_ms": ms(measured), "replayed_step_ms": ms(actual),
                    "ideal_step_ms": ms(ideal),
                    "slowdown": r(actual / ideal) if ideal else None,
                    "saved_ms": ms(actual - ideal)})
    return sorted(out, key=lambda s: s["step"]), savings


def _rank_table(p: Mapping[str, Any], per_match: list[dict[str, Any]], data: list[dict[str, Any]],
                savings: dict[int, list[float]],
                steps_out: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    ranks = sorted({x["rank"] for x in data})
    step_ms = statistics.median([s["step_ms"] for s in steps_out]) if steps_out else None
    out, blamed = [], {}
    for rk in ranks:
        mine = [m for m in per_match if rk in m["ranks"]]
        last = [m for m in mine if m["last_rank"] == rk and m["blameable"]]
        save = statistics.median(savings[rk]) / NS_PER_MS if savings.get(rk) else None
        share = len(last) / len(mine) if mine else 0.0
        extra = statistics.median([m["extra_compute_ns"] for m in last]) if last else None
        late = statistics.median([m["lateness_ns"] for m in last]) if last else None
        kind = None
        if last and late is not None:
            kind = "compute" if extra is not None and extra >= 0.5 * late else "communication"
        row = {"rank": rk, "matches": len(mine), "times_last": len(last),
               "share_last": r(share), "lateness_ms_median": ms(late),
               "extra_compute_ms_median": ms(extra),
               "wait_ms_total": ms(sum(x["wait_ns"] for x in data if x["rank"] == rk)),
               "saving_ms_per_step": r(save), "kind": kind}
        out.append(row)
        if (last and share >= p["min_share"] and save is not None and step_ms
                and save >= p["min_saving_share"] * step_ms):
            blamed[rk] = kind or "communication"
    return out, blamed


def _findings(blamed: dict[int, str], rank_rows: list[dict[str, Any]],
              per_match: list[dict[str, Any]], steps_out: list[dict[str, Any]]) -> list[Finding]:
    out = []
    step_ms = statistics.median([s["step_ms"] for s in steps_out]) if steps_out else None
    for rk, kind in sorted(blamed.items()):
        row = next(x for x in rank_rows if x["rank"] == rk)
        late = sorted((m for m in per_match if m["last_rank"] == rk and m["blameable"]),
                      key=lambda m: -m["lateness_ns"])
        save = row["saving_ms_per_step"]
        code = "STRAGGLER_COMPUTE" if kind == "compute" else "STRAGGLER_COMM"
        why = (f"it computes {row['extra_compute_ms_median']:.2f} ms more than its peers' median "
               "before the collective" if kind == "compute" else
               "it arrives late without computing more than its peers (its previous "
               "communication, kernel launches or host work hold it back)")
        out.append(Finding(
            code=code, severity=Severity.CRITICAL if step_ms and save and save > 0.1 * step_ms
            else Severity.WARNING,
            title=f"Rank {rk} is a {kind} straggler: last to arrive at {row['times_last']} of "
                  f"{row['matches']} collectives, {row['lateness_ms_median']:.2f} ms late (median)",
            evidence=Evidence(
                ranks=(rk,), steps=tuple(sorted({m["step"] for m in late if m["step"] is not None})),
                time_ranges_ns=tuple((m["A"] - m["lateness_ns"], m["A"]) for m in late[:5]),
                numbers={"times_last": row["times_last"], "matches": row["matches"],
                         "lateness_ms_median": row["lateness_ms_median"],
                         "extra_compute_ms_median": row["extra_compute_ms_median"],
                         "saving_ms_per_step": save, "step_ms": r(step_ms)}),
            impact_ms_per_step=save, impact_share=r(save / step_ms) if save and step_ms else None,
            suggestion=(f"Rank {rk}: {why}. " + (
                "Check its device (clocks, thermals, ECC, a slower GPU), uneven work (data "
                "sharding, sequence lengths, an extra layer), or background processes on its "
                "host." if kind == "compute" else
                "Look at its timeline before the late collectives: host-side stalls (data "
                "loading, GC, logging on that rank), CPU launch overhead, or a slower link.")
                + f" At the median speed the step would be {save:.2f} ms shorter."),
            analyzer=NAME, view="stragglers"))
    return out
