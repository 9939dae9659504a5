"""Time breakdown and comm/compute overlap, per rank and per step.

On ranks with device events the intervals are the device's kernels: compute, communication
(NCCL/RCCL) and memcpy/memset, across all streams. On host-only ranks (gloo on CPU) compute is the
time a thread spends in operators minus its own communication waits, and communication is the
gloo/c10d spans on any thread. A sweep over interval unions (tracelab.analyzers._intervals) splits
each step's window [first start, last end] into compute, exposed communication, exposed memcpy
and idle, which add up to the window; overlapped communication is communication under compute.

Overlap % is HTA's |C ∩ M| / |M| over merged intervals. The run-level numbers use one window per
rank from its first to its last event over the included steps (HTA's kernel_time), so with
`exclude_last_step` they reproduce HTA's temporal breakdown and overlap (tests/analyzers/
test_hta_crosscheck.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.analyzers import _intervals as iv
from tracelab.analyzers._collectives import BUS_FACTOR_SQL, cached_matched
from tracelab.analyzers._common import (
    median,
    merge_params,
    ms,
    r,
    ranks_str,
    rows,
    run_info,
    temp_table_exists,
)
from tracelab.load_sql import op_sql
from tracelab.results import Evidence, Finding, Result, Severity

NAME = "breakdown"
TITLE = "Time breakdown and comm/compute overlap"
VIEW = "overview"
DEFAULTS: dict[str, Any] = {
    # Flag exposed communication above this share of the step (median over steps, per rank).
    "exposed_comm_threshold": 0.10,
    # Leave out each rank's last profiler step, as HTA does by default.
    "exclude_last_step": False,
    # Select the run-level (per-rank) events exactly as HTA 0.5 does: device work whose host
    # launch is in the trace and starts before the last ProfilerStep (HTA drops device events
    # whose launch the profiler lost, and keeps those launched before the first step). Per-step
    # numbers are unaffected.
    "hta_compatible": False,
}

#: Device events as HTA's temporal breakdown and overlap select them. Binds run_id x3.
HTA_DEVICE_SQL = """
    SELECT e.rank, e.step, e.stream AS tid, e.ts_ns AS t0, e.ts_ns + e.dur_ns AS t1,
           CASE e.category WHEN 'compute' THEN 'compute' WHEN 'communication' THEN 'comm'
                ELSE 'memcpy' END AS cls
    FROM events e
    JOIN (SELECT rank, correlation, min(ts_ns) AS launch_ns FROM events
          WHERE run_id = ? AND NOT on_device AND correlation IS NOT NULL
          GROUP BY rank, correlation) l ON l.rank = e.rank AND l.correlation = e.correlation
    JOIN (SELECT rank, max(start_ns) AS last_start FROM steps WHERE run_id = ? GROUP BY rank) s
      ON s.rank = e.rank AND l.launch_ns < s.last_start
    WHERE e.run_id = ? AND e.on_device
      AND e.category IN ('compute', 'communication', 'memcpy', 'memset')
"""

#: Point-to-point op names, as collectives.op or event names.
P2P_NAMES = ("send", "recv", "send_recv", "gloo:send", "gloo:recv", "c10d::send", "c10d::recv_")

_FIELDS = ("window_ns", "compute_ns", "exposed_comm_ns", "overlapped_comm_ns", "comm_ns",
           "exposed_memcpy_ns", "idle_ns")


#: Host operators per thread: 'compute' for cpu_ops, 'comm' for communication *operators*
#: (c10d::*, record_param_comms), whose span is the thread's own wait. gloo:* annotations are
#: excluded here: on gloo they time the transfer asynchronously and may span compute that runs
#: meanwhile. Binds run_id.
HOST_OPS_SQL = """SELECT rank, step, tid, ts_ns AS t0, ts_ns + dur_ns AS t1,
                         CASE WHEN category = 'cpu_op' THEN 'compute' ELSE 'comm' END AS cls
                  FROM events
                  WHERE run_id = ? AND NOT on_device AND cat = 'cpu_op'
                    AND category IN ('cpu_op', 'communication') AND step IS NOT NULL"""


#: Device work: kernels (compute or communication), memcpy and memset. Binds run_id.
_DEVICE_SQL = """
    SELECT rank, step, stream AS tid, ts_ns AS t0, ts_ns + dur_ns AS t1,
           CASE category WHEN 'compute' THEN 'compute' WHEN 'communication' THEN 'comm'
                ELSE 'memcpy' END AS cls, idx, true AS device,
           CASE WHEN category = 'communication' THEN name END AS name
    FROM events
    WHERE run_id = ? AND on_device AND step IS NOT NULL
      AND category IN ('compute', 'communication', 'memcpy', 'memset')"""


def intervals_sql(host: bool = True) -> str:
    """Classified intervals (rank, step, tid, t0, t1, cls, idx, device, name). Binds run_id x4,
    or x1 with host=False (a run whose every rank has device work: no host-only part)."""
    if not host:
        return _DEVICE_SQL
    return f"""
    WITH _dev AS (SELECT DISTINCT rank FROM events WHERE run_id = ? AND on_device
                  AND category IN ('compute', 'communication')),
    _hs AS ({HOST_OPS_SQL} AND rank NOT IN (SELECT rank FROM _dev))
    {_DEVICE_SQL}
    UNION ALL
    SELECT rank, step, tid, t0, t1, 'compute', NULL, false, NULL
    FROM ({iv.host_compute_sql('SELECT * FROM _hs', 'rank, step, tid')})
    UNION ALL
    SELECT rank, step, tid, ts_ns, ts_ns + dur_ns, 'comm', idx, false, name
    FROM events
    WHERE run_id = ? AND NOT on_device AND category = 'communication' AND step IS NOT NULL
      AND rank NOT IN (SELECT rank FROM _dev)
    """


def cached_intervals(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, str]:
    """Names of two temporary tables, built once per connection and run, shared by the
    analyzers: the run's classified intervals (intervals_sql, plus `in_last_step`) and their
    per-rank sweep (_intervals.segments_sql). Temporary tables live and die with the connection;
    run ids are never reused, so a cached run cannot go stale under its id."""
    rid = int(run_id)
    ivt, segt = f"_tl_cache_iv_{rid}", f"_tl_cache_seg_{rid}"
    if temp_table_exists(con, segt):
        return ivt, segt
    con.execute(f"DROP TABLE IF EXISTS {ivt}")

    def fetch(host: bool) -> pa.Table:
        return con.sql(
            f"""SELECT i.*, coalesce(i.step = ls.last_step, false) AS in_last_step
                FROM ({intervals_sql(host)}) i
                LEFT JOIN (SELECT rank, max(step) AS last_step FROM steps WHERE run_id = ?
                           GROUP BY rank) ls USING (rank)""",
            params=[rid] * (5 if host else 2)).to_arrow_table()

    # Device intervals first; the host-only part only when some rank has no device compute or
    # communication in them (with every rank on the device, that part is empty anyway).
    ivs = fetch(False)
    dev = pc.unique(ivs.filter(pc.is_in(ivs.column("cls"), pa.array(["compute", "comm"])))
                    .column("rank")).to_pylist()
    n_ranks = con.execute("SELECT count(*) FROM ranks WHERE run_id = ?", [rid]).fetchall()[0][0]
    if len(dev) < n_ranks:
        ivs = fetch(True)
    con.register("_tl_arrow_intervals", ivs)
    try:
        con.execute(f"CREATE TEMP TABLE {ivt} AS SELECT * FROM _tl_arrow_intervals")
    finally:
        con.unregister("_tl_arrow_intervals")
    iv.materialize_segments(con, segt, ivs)
    return ivt, segt


def _row_out(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in _FIELDS and k not in ("t_first", "t_last")}
    for k in _FIELDS:
        out[k.replace("_ns", "_ms")] = ms(row[k])
    w, comm = row["window_ns"], row["comm_ns"]
    out["overlap_pct"] = r(100.0 * row["overlapped_comm_ns"] / comm, 3) if comm else None
    for part in ("compute", "exposed_comm", "exposed_memcpy", "idle"):
        out[f"{part}_pct"] = r(100.0 * row[f"{part}_ns"] / w, 3) if w else None
    nc = row["exposed_comm_ns"] + row["exposed_memcpy_ns"]
    out["non_compute_pct"] = r(100.0 * nc / w, 3) if w else None
    return out


def _bandwidth(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict[str, Any]]:
    """Per (op, group, size): matched count, median transfer time, algbw and busbw in GB/s."""
    mt, _ = cached_matched(con, run_id)
    if mt is None:
        return []
    return rows(con, f"""
        WITH per AS (SELECT key, any_value(op) AS op, any_value(pg_name) AS pg_name,
                            any_value(bytes) AS bytes, any_value(n) AS n,
                            any_value(transfer_ns) AS transfer_ns FROM {mt} GROUP BY key)
        SELECT op, pg_name, bytes, n AS ranks, count(*) AS count,
               round(median(transfer_ns) / 1e6, 4) AS transfer_ms,
               round(median(bytes / transfer_ns), 3) AS algbw_gbps,
               round(median(bytes / transfer_ns * {BUS_FACTOR_SQL}), 3) AS busbw_gbps
        FROM per WHERE transfer_ns > 0 AND bytes IS NOT NULL
        GROUP BY op, pg_name, bytes, n ORDER BY count(*) * median(transfer_ns) DESC
        """, [])


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = run_info(con, run_id)
    tbl, seg = cached_intervals(con, run_id)
    # One sweep per rank over all its intervals; steps are windows cut out of it, so a
    # kernel of step N+1 that runs during step N's window counts where it runs.
    windows = con.sql(f"SELECT rank, step, min(t0) AS w0, max(t1) AS w1 FROM {tbl} "
                      "GROUP BY rank, step ORDER BY rank, step").to_arrow_table()
    if not (p["hta_compatible"] or p["exclude_last_step"]):
        # The sweep spans exactly each rank's [first start, last end]: nothing to cut.
        windows = pa.concat_tables([windows, con.sql(
            f"SELECT rank, NULL::INTEGER AS step, min(t) AS w0, max(t) AS w1 FROM {seg} "
            "GROUP BY rank ORDER BY rank").to_arrow_table()])
    got = iv.window_totals(con, seg, *(windows.column(k).to_numpy()
                                       for k in ("rank", "w0", "w1")))
    table = windows.rename_columns(["rank", "step", "t_first", "t_last"])
    for k, v in got.items():
        table = table.append_column(k, pa.array(v))
    per_step = table.filter(table.column("step").is_valid()).to_pylist()
    per_rank = table.filter(table.column("step").is_null()).drop_columns(["step"]).to_pylist()
    if p["hta_compatible"]:
        rank_bd = iv.breakdown_sql(HTA_DEVICE_SQL, "rank")
        per_rank = rows(con, f"SELECT * FROM ({rank_bd}) ORDER BY rank", [run_id] * 6)
    elif p["exclude_last_step"]:
        rank_bd = iv.breakdown_sql(f"SELECT * FROM {tbl} WHERE NOT in_last_step", "rank")
        per_rank = rows(con, f"SELECT * FROM ({rank_bd}) ORDER BY rank", [])
    op_case, op_params = op_sql("ev.name")
    keyed = f"""
        SELECT ev.rank, CASE WHEN c.op IS NOT NULL THEN c.op ELSE {op_case} END AS op, c.pg_name,
               c.in_bytes AS bytes, ev.t0, ev.t1
        FROM {tbl} ev
        LEFT JOIN collectives c ON c.run_id = ? AND c.rank = ev.rank
             AND c.event_idx = ev.idx AND c.source IN ('kernel', 'host')
        WHERE ev.cls = 'comm' AND ev.idx IS NOT NULL"""
    # Per collective kind: the union of its events (concurrent buckets count once),
    # intersected with the exposed segments.
    kunion = con.sql(f"SELECT rank, op, pg_name, bytes, t0, t1 FROM "
                     f"({iv.union_sql(keyed, 'rank, op, pg_name, bytes')})",
                     params=[*op_params, run_id]).to_arrow_table()
    got = iv.covered(con, seg, "exposed_comm", kunion.column("rank").to_numpy(),
                     kunion.column("t0").to_numpy(), kunion.column("t1").to_numpy())
    total: dict[tuple[Any, ...], int] = {}
    for key, ns in zip(zip(*(kunion.column(k).to_pylist()
                             for k in ("rank", "op", "pg_name", "bytes")), strict=True),
                       got.tolist(), strict=True):
        total[key] = total.get(key, 0) + ns
    exposed_by = sorted(({"rank": k[0], "op": k[1], "pg_name": k[2], "bytes": k[3],
                          "exposed_ns": ns} for k, ns in total.items() if ns > 0),
                        key=lambda x: -x["exposed_ns"])
    dev = {int(x[0]) for x in con.execute(
        f"SELECT DISTINCT rank FROM {tbl} WHERE device").fetchall()}
    bw = _bandwidth(con, run_id)
    steps_tbl = [_row_out(x) for x in per_step]
    ranks_tbl = [{**_row_out(x), "mode": "device" if x["rank"] in dev else "host"}
                 for x in per_rank]
    findings = _findings(p, steps_tbl, exposed_by, bw, per_step)
    overlaps = [x["overlap_pct"] for x in ranks_tbl if x["overlap_pct"] is not None]
    metrics = {
        "ranks": len(ranks_tbl),
        "steps": len({x["step"] for x in steps_tbl}),
        "overlap_pct_mean": r(sum(overlaps) / len(overlaps), 3) if overlaps else None,
        "step_window_ms_median": r(median([x["window_ms"] for x in steps_tbl])),
        "compute_share_median": r(median([x["compute_pct"] / 100 for x in steps_tbl
                                          if x["compute_pct"] is not None])),
        "exposed_comm_share_median": r(median([x["exposed_comm_pct"] / 100 for x in steps_tbl
                                               if x["exposed_comm_pct"] is not None])),
        "idle_share_median": r(median([x["idle_pct"] / 100 for x in steps_tbl
                                       if x["idle_pct"] is not None])),
    }
    notes = []
    if not steps_tbl:
        notes.append("no events inside profiler steps: nothing to break down "
                     "(profile with a schedule so that ProfilerStep#N spans exist).")
    if any(x["mode"] == "host" for x in ranks_tbl):
        notes.append("host-only ranks: compute is operator time minus the thread's own "
                     "communication waits; communication is gloo/c10d spans on any thread.")
    return Result(analyzer=NAME, run=info["name"], params=p, metrics=metrics,
                  tables={"ranks": ranks_tbl, "steps": steps_tbl, "exposed_by_collective": [
                      {**{k: v for k, v in x.items() if k != "exposed_ns"},
                       "exposed_ms": ms(x["exposed_ns"])} for x in exposed_by],
                      "bandwidth": bw},
                  findings=tuple(findings), notes=tuple(notes))


def _findings(p: Mapping[str, Any], steps_tbl: list[dict[str, Any]],
              exposed_by: list[dict[str, Any]], bw: list[dict[str, Any]],
              per_step: list[dict[str, Any]]) -> list[Finding]:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for x in steps_tbl:
        by_rank.setdefault(x["rank"], []).append(x)
    hot: dict[int, tuple[float, float, float, float | None]] = {}
    for rank, xs in by_rank.items():
        share = median([x["exposed_comm_ms"] / x["window_ms"] for x in xs if x["window_ms"]])
        if share is not None and share > p["exposed_comm_threshold"]:
            hot[rank] = (share, median([x["exposed_comm_ms"] for x in xs]) or 0.0,
                         median([x["window_ms"] for x in xs]) or 0.0, median(
                             [x["overlap_pct"] for x in xs if x["overlap_pct"] is not None]))
    if not hot:
        return []
    n_steps = max(len(v) for v in by_rank.values())
    impact = sum(v[1] for v in hot.values()) / len(hot)
    step_ms = sum(v[2] for v in hot.values()) / len(hot)
    share = impact / step_ms if step_ms else None
    agg: dict[tuple[Any, ...], float] = {}
    for x in exposed_by:
        if x["rank"] in hot:
            key = (x["op"], x["pg_name"], x["bytes"])
            agg[key] = agg.get(key, 0.0) + float(x["exposed_ns"])
    numbers: dict[str, float | int | str | None] = {
        "exposed_comm_ms_per_step": r(impact), "step_ms": r(step_ms),
        "exposed_comm_share": r(share), "overlap_pct": r(median([v[3] for v in hot.values()
                                                                  if v[3] is not None]), 3),
        "threshold_share": p["exposed_comm_threshold"]}
    bw_by = {(b["op"], b["pg_name"], b["bytes"]): b for b in bw}
    names = []
    for i, (key, tot) in enumerate(sorted(agg.items(), key=lambda kv: -kv[1])[:3], 1):
        op, pg, nbytes = key
        b = bw_by.get(key)
        per_step_ms = tot / len(hot) / max(n_steps, 1) / 1e6
        size = f"{nbytes / 2**20:.1f} MiB" if nbytes else "size unknown"
        text = f"{op} of {size} on group {pg if pg is not None else '?'}: " \
               f"{per_step_ms:.3f} ms exposed per step"
        if b is not None:
            text += f", algbw {b['algbw_gbps']} GB/s, busbw {b['busbw_gbps']} GB/s"
        numbers[f"collective_{i}"] = text
        names.append(f"{op} ({size})")
    worst = max(hot, key=lambda k: hot[k][0])
    ranges = tuple((int(x["t_first"]), int(x["t_last"])) for x in per_step
                   if x["rank"] == worst)[:5]
    sev = Severity.CRITICAL if share is not None and share > 2.5 * p["exposed_comm_threshold"] \
        else Severity.WARNING
    what = ", ".join(names) if names else "communication"
    p2p = bool(names) and all(n.split(" ")[0] in P2P_NAMES for n in names)
    return [Finding(
        code="EXPOSED_COMM", severity=sev,
        title=f"Exposed communication costs {100 * (share or 0):.1f}% of the step on "
              f"{ranks_str(list(hot))} ({what})",
        evidence=Evidence(ranks=tuple(sorted(hot)), time_ranges_ns=ranges, numbers=numbers,
                          steps=tuple(sorted({x["step"] for x in steps_tbl}))),
        impact_ms_per_step=r(impact), impact_share=r(share),
        suggestion=(
            f"These are pipeline point-to-point waits ({what}): the pipeline bubble seen from "
            "the communication side (see PIPELINE_BUBBLE / PIPELINE_STALL). Post receives "
            "early and overlap send/recv with compute (batched async p2p)." if p2p else
            f"Overlap {what} with compute: start gradient all-reduces during backward (DDP "
            "bucket_cap_mb smaller, FSDP backward_prefetch / reshard_after_forward=False), "
            "prefetch parameters one layer ahead, and keep collectives on their own stream. "
            "If busbw is far below the link's rate, check the network/NCCL settings; if the "
            "bytes are the problem, communicate in bf16 or shard fewer parameters."),
        analyzer=NAME, view="timeline")]
