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
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.analyzers import _intervals as iv
from tracelab.analyzers._collectives import cached_matched, offsets_relation
from tracelab.analyzers._common import NS_PER_MS, merge_params, ms, r, run_info
from tracelab.analyzers._replay import columns as replay_columns
from tracelab.analyzers._replay import whatif
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


def _gaps(con: duckdb.DuckDBPyConnection, run_id: int, matched: str,
          offsets: dict[int, int]) -> pa.Table:
    """Matched rows plus each rank's gap since its previous collective (or its step start)
    and the compute inside that gap, all aligned, ordered by step, last arrival and rank.
    The joins are SQL; the per-rank walk, the compute lookups and the per-match peers are numpy
    over the 16k-row table (DuckDB's windows cost about a microsecond a row here)."""
    rel, rel_params = offsets_relation(offsets)
    _, seg = cached_intervals(con, run_id)
    t = con.sql(f"""
        WITH off AS {rel},
        st AS (SELECT s.rank, s.step, s.start_ns - coalesce(o.off_ns, 0) AS s0,
                      greatest(s.end_ns, coalesce(s.device_end_ns, s.end_ns))
                        - coalesce(o.off_ns, 0) AS s1
               FROM steps s LEFT JOIN off o USING (rank) WHERE s.run_id = ?)
        SELECT mt.rank, key, op, mt.step, start_ns, a_ns, e_ns, n, last_arrival_ns, last_rank,
               transfer_ns, wait_ns, st.s0, st.s1
        FROM {matched} mt LEFT JOIN st ON st.rank = mt.rank AND st.step = mt.step
        ORDER BY mt.rank, mt.step, a_ns""", params=[*rel_params, run_id]).to_arrow_table()
    col = {k: t.column(k).fill_null(0).to_numpy().astype(np.int64, copy=False)
           for k in ("rank", "step", "start_ns", "a_ns", "e_ns", "last_rank", "s0", "wait_ns")}
    has_step = t.column("step").is_valid().to_numpy(zero_copy_only=False)
    has_s0 = t.column("s0").is_valid().to_numpy(zero_copy_only=False)
    rank, a_ns = col["rank"], col["a_ns"]
    # The previous collective's end on the same rank in the same step, else the step's start.
    same = np.zeros(len(rank), dtype=bool)
    same[1:] = ((rank[1:] == rank[:-1]) & (has_step[1:] == has_step[:-1])
                & (col["step"][1:] == col["step"][:-1]))
    prev = np.where(has_s0, np.minimum(col["s0"], a_ns), a_ns)
    prev[1:] = np.where(same[1:], col["e_ns"][:-1], prev[1:])
    gap = np.maximum(a_ns - prev, 0)
    # The gap on the rank's own clock (raw), where its compute intervals live.
    start = col["start_ns"]
    compute = np.maximum(iv.covered(con, seg, "compute", rank, prev + (start - a_ns), start), 0)
    # The last arriver's lateness over the next-latest, and its peers' compute.
    enc = t.column("key").combine_chunks().dictionary_encode()
    code = enc.indices.to_numpy().astype(np.int64, copy=False)
    nkeys = len(enc.dictionary)
    peer = np.flatnonzero(rank != col["last_rank"])
    second = np.full(nkeys, np.iinfo(np.int64).min)
    np.maximum.at(second, code[peer], a_ns[peer])
    peer = peer[np.lexsort((compute[peer], code[peer]))]
    cnt = np.bincount(code[peer], minlength=nkeys)
    none = cnt[code] == 0
    vals = np.append(compute[peer], 0)  # a 0 for keys without peers (masked below)
    first = np.cumsum(cnt) - cnt
    lo = vals[np.where(cnt > 0, first + (cnt - 1) // 2, len(peer))]
    hi = vals[np.where(cnt > 0, first + cnt // 2, len(peer))]
    # DuckDB's median of integers: the lower middle plus half the distance to the upper.
    med = lo + (hi - lo) * 0.5
    out = t.drop_columns(["start_ns"])
    for name, values in (("prev_ns", prev), ("gap_ns", gap), ("compute_ns", compute)):
        out = out.append_column(name, pa.array(values))
    out = out.append_column("second_ns", pa.array(second[code], mask=none))
    out = out.append_column("peer_compute_ns", pa.array(med[code], mask=none))
    # Rounded and ordered by DuckDB, so the milliseconds are SQL's round() digit for digit.
    con.register("_tl_gaps", out)
    try:
        return con.sql("""SELECT *, round(wait_ns / 1e6, 4) AS wait_ms,
                                 round(gap_ns / 1e6, 4) AS gap_ms,
                                 round(compute_ns / 1e6, 4) AS compute_ms
                          FROM _tl_gaps ORDER BY step, last_arrival_ns, rank""").to_arrow_table()
    finally:
        con.unregister("_tl_gaps")


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = run_info(con, run_id)
    matched, clocks = cached_matched(con, run_id)
    source = clocks.source
    data = _gaps(con, run_id, matched, clocks.offsets_ns) if matched else None
    if data is None or not data.num_rows:
        return Result(analyzer=NAME, run=info["name"], params=p, metrics={"matched": 0},
                      notes=("no collective is matched across two or more ranks: nothing to "
                             "compare (single-rank trace, or no timed collectives).",))
    unc = clocks.uncertainty_ns
    # Plain Python only for what is read row by row; the 16k-row table stays in Arrow/numpy.
    col = {k: data.column(k).to_pylist() for k in ("rank", "key", "step", "compute_ns", "wait_ns")}
    ranks_of: dict[str, list[int]] = {}
    for key, rk in zip(col["key"], col["rank"], strict=True):
        ranks_of.setdefault(key, []).append(rk)
    # Never blame lateness within the clocks' uncertainty: the last rank's plus its peers'.
    margin_of = {rk: u + max((v for o, v in unc.items() if o != rk), default=0)
                 for rk, u in unc.items()}
    per_match = []
    for x in data.filter(pc.equal(data.column("rank"), data.column("last_rank"))).to_pylist():
        late = x["a_ns"] - x["second_ns"]
        margin = margin_of.get(x["rank"], 0)
        per_match.append({
            "key": x["key"], "op": x["op"], "step": x["step"], "last_rank": x["rank"],
            "lateness_ns": late, "blameable": late > margin, "margin_ns": margin,
            "transfer": x["transfer_ns"], "A": x["last_arrival_ns"],
            "ranks": sorted(ranks_of[x["key"]]),
            "extra_compute_ns": x["compute_ns"] - x["peer_compute_ns"]})
    per_match.sort(key=lambda m: (m["step"] if m["step"] is not None else -1, m["A"]))
    steps_out, savings = whatif(per_match, replay_columns(data))
    waits_by: dict[int, int] = {}
    for rk, w in zip(col["rank"], col["wait_ns"], strict=True):
        waits_by[rk] = waits_by.get(rk, 0) + w
    rank_rows, blamed = _rank_table(p, per_match, waits_by, savings, steps_out)
    findings = _findings(blamed, rank_rows, per_match, steps_out)
    slow = [s["slowdown"] for s in steps_out if s["slowdown"] is not None]
    metrics = {
        "source": source, "matched": len(per_match), "ranks": len(waits_by),
        "clock_uncertainty_ms_max": ms(max(unc.values(), default=0)),
        "blameable_share": r(sum(m["blameable"] for m in per_match) / len(per_match)),
        "transfer_ms_median": ms(statistics.median(m["transfer"] for m in per_match)),
        "step_ms_median": r(statistics.median([s["step_ms"] for s in steps_out])) if steps_out else None,
        "ideal_step_ms_median": r(statistics.median([s["ideal_step_ms"] for s in steps_out]))
        if steps_out else None,
        "slowdown_median": r(statistics.median(slow)) if slow else None,
        "stragglers": sorted(blamed),
    }
    step_ranks = _step_ranks(per_match, col)
    last_of: dict[Any, tuple[int, int | None]] = {}
    for x in step_ranks:
        if x["times_last"] and x["times_last"] >= last_of.get(x["step"], (0, None))[0]:
            last_of[x["step"]] = (x["times_last"], x["rank"])
    for s in steps_out:
        s["last_arriver"] = last_of.get(s["step"], (0, None))[1]
    coll_rows = [{"key": m["key"], "op": m["op"], "step": m["step"], "last_rank": m["last_rank"],
                  "lateness_ms": ms(m["lateness_ns"]), "transfer_ms": ms(m["transfer"]),
                  "blameable": m["blameable"], "last_arrival_ns": m["A"]} for m in per_match]
    waits = data.select(["key", "rank", "step", "wait_ms", "a_ns", "e_ns", "gap_ms", "compute_ms"]
                        ).rename_columns(["key", "rank", "step", "wait_ms", "arrival_ns", "end_ns",
                                          "gap_ms", "compute_ms"]).to_pylist()
    return Result(analyzer=NAME, run=info["name"], params=p, metrics=metrics,
                  tables={"ranks": rank_rows, "steps": steps_out, "step_ranks": step_ranks,
                          "collectives": coll_rows,
                          "waits": waits}, findings=tuple(findings),
                  notes=(f"collectives from source '{source}', clocks aligned by "
                         f"{', '.join(sorted(set(clocks.method.values())))}; lateness within "
                         "the clock uncertainty is never blamed.",))


def _step_ranks(per_match: list[dict[str, Any]],
                col: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Per step and rank: compute before its collectives, time waiting in them, and how often
    it was the (blameable) last to arrive."""
    out: dict[tuple[Any, int], dict[str, Any]] = {}
    for step, rk, comp, wait in zip(col["step"], col["rank"], col["compute_ns"], col["wait_ns"],
                                    strict=True):
        row = out.get((step, rk))
        if row is None:
            row = out[(step, rk)] = {"step": step, "rank": rk, "compute_ns": 0, "wait_ns": 0,
                                     "times_last": 0}
        row["compute_ns"] += comp
        row["wait_ns"] += wait
    for m in per_match:
        if m["blameable"] and (m["step"], m["last_rank"]) in out:
            out[(m["step"], m["last_rank"])]["times_last"] += 1
    return [{"step": v["step"], "rank": v["rank"], "compute_ms": ms(v["compute_ns"]),
             "wait_ms": ms(v["wait_ns"]), "times_last": v["times_last"]}
            for _, v in sorted(out.items(), key=lambda kv: (kv[0][0] is None, kv[0]))]


def _rank_table(p: Mapping[str, Any], per_match: list[dict[str, Any]], waits_by: dict[int, int],
                savings: dict[int, list[float]],
                steps_out: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    ranks = sorted(waits_by)
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
               "wait_ms_total": ms(waits_by[rk]),
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
