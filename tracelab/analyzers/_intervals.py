"""Interval algebra in SQL: unions, and the sweep that splits time into compute/comm/memcpy/idle.

Every function returns SQL text over a relation of intervals named by the caller; values are never
formatted in (callers bind parameters). Intervals are half-open [t0, t1) in ns; touching intervals
merge, like HTA's merge_kernel_intervals.

The sweep (FACTS.md section 3): each interval contributes +1 at t0 and -1 at t1 to its class
counter; a running sum per group gives, for every elementary segment between two boundaries,
which classes cover it. Then compute = covered by compute; exposed comm = comm and no compute;
overlapped comm = comm and compute; exposed memcpy = memcpy, no compute, no comm; idle = none,
inside the group's [first start, last end] window. The parts add up to the window exactly.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Interval classes the breakdown sweep counts.
CLASSES = ("compute", "comm", "memcpy")


def union_sql(src: str, keys: str) -> str:
    """Merged intervals of `src` (columns: KEYS..., t0, t1) per KEYS: sort by start, running max
    of end, a new group when a start is past the running max (the HTA/TraceLens method)."""
    return f"""
    SELECT {keys}, min(t0) AS t0, max(t1) AS t1
    FROM (
        SELECT {keys}, t0, t1,
               sum(CASE WHEN t0 > _prev_end THEN 1 ELSE 0 END)
                   OVER (PARTITION BY {keys} ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS _grp
        FROM (
            SELECT {keys}, t0, t1,
                   coalesce(max(t1) OVER (PARTITION BY {keys} ORDER BY t0, t1
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                            -9223372036854775807) AS _prev_end
            FROM ({src})
        )
    )
    GROUP BY {keys}, _grp
    """


#: Class counters are packed into one DOUBLE (compute * 2^34 + comm * 2^17 + memcpy) so that a
#: single running sum gives all three: every partial sum is an integer below 2^53, exact in a
#: double, as long as fewer than 2^17 intervals of one class overlap. One window aggregate
#: instead of three halves the sweep's cost in DuckDB.
_SHIFT = {"compute": 34, "comm": 17, "memcpy": 0}
_PACK = {k: float(1 << v) for k, v in _SHIFT.items()}


def segments_sql(src: str, keys: str) -> str:
    """Elementary segments of the sweep over `src` (columns: KEYS..., t0, t1, cls) per KEYS:
    (KEYS..., t, len, c, m, y) with c/m/y the number of compute/comm/memcpy intervals covering
    [t, t + len)."""
    w = (f"CASE cls WHEN 'compute' THEN {_PACK['compute']} WHEN 'comm' THEN {_PACK['comm']} "
         f"ELSE {_PACK['memcpy']} END")
    return f"""
    SELECT {keys}, t, len,
           (s // {_PACK['compute']})::BIGINT AS c,
           ((s % {_PACK['compute']}) // {_PACK['comm']})::BIGINT AS m,
           (s % {_PACK['comm']})::BIGINT AS y
    FROM (
        SELECT {keys}, t, lead(t) OVER w - t AS len, sum(d) OVER w AS s
        FROM (SELECT {keys}, t0 AS t, {w} AS d FROM ({src})
              UNION ALL
              SELECT {keys}, t1 AS t, -{w} AS d FROM ({src}))
        -- Boundaries at one instant need no merging: between them len = 0, and the state
        -- after the last of them is the cumulative one.
        WINDOW w AS (PARTITION BY {keys} ORDER BY t, d ROWS UNBOUNDED PRECEDING)
    )
    """


def breakdown_sql(src: str, keys: str) -> str:
    """Per KEYS: window_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns, comm_ns,
    exposed_memcpy_ns, idle_ns, t_first, t_last. compute + exposed comm + exposed memcpy + idle
    = window."""
    return aggregate_sql(f"({segments_sql(src, keys)})", keys)


def aggregate_sql(segments: str, keys: str) -> str:
    """breakdown_sql's columns from a relation of segments (segments_sql's output) per KEYS."""
    return f"""
    SELECT {keys},
           max(t) - min(t) AS window_ns,
           min(t) AS t_first, max(t) AS t_last,
           coalesce(sum(len) FILTER (WHERE c > 0), 0) AS compute_ns,
           coalesce(sum(len) FILTER (WHERE m > 0 AND c = 0), 0) AS exposed_comm_ns,
           coalesce(sum(len) FILTER (WHERE m > 0 AND c > 0), 0) AS overlapped_comm_ns,
           coalesce(sum(len) FILTER (WHERE m > 0), 0) AS comm_ns,
           coalesce(sum(len) FILTER (WHERE y > 0 AND c = 0 AND m = 0), 0) AS exposed_memcpy_ns,
           coalesce(sum(len) FILTER (WHERE c = 0 AND m = 0 AND y = 0), 0) AS idle_ns
    FROM {segments}
    GROUP BY ALL
    """


#: Measures kept as running totals on materialized segments: name -> state condition.
MEASURES = {
    "compute": "{a}.c > 0",
    "exposed_comm": "{a}.m > 0 AND {a}.c = 0",
    "overlapped_comm": "{a}.m > 0 AND {a}.c > 0",
    "exposed_memcpy": "{a}.y > 0 AND {a}.c = 0 AND {a}.m = 0",
    "busy": "{a}.c > 0 OR {a}.m > 0 OR {a}.y > 0",
}


#: The same packing in integers for the numpy sweep: 17 bits a counter, exact in an int64.
_BITS = {k: 1 << v for k, v in _SHIFT.items()}
_FIELD = (1 << 17) - 1


def materialize_segments(con: duckdb.DuckDBPyConnection, table: str, src: str | pa.Table,
                         params: list[object] | None = None) -> None:
    """CREATE TEMP TABLE `table`: segments_sql(src, 'rank')'s segments of positive length (rank,
    t, len, c, m, y; len NULL after a rank's last boundary), one row per instant, plus for each
    of MEASURES the running total before the segment (`cum_<measure>`), so that any window's
    breakdown is two ASOF lookups (window_sql) instead of a range join.

    The sweep is segments_sql's, but its ordered running sums are taken by numpy over the Arrow
    columns: DuckDB's window operator costs about a microsecond a row here, numpy's sort and
    cumsum a few tens of nanoseconds, and this sweep is the analyzers' hottest loop. Selecting
    and classifying before, and every window, join and sum after, stay SQL;
    tests/analyzers/test_schedules_intervals.py checks both forms agree. `src` is SQL (binding
    `params`) or an Arrow table already fetched, with columns rank, t0, t1, cls."""
    # Through Arrow, not fetchnumpy: that one imports pandas (half a second) on first use.
    cols = src if isinstance(src, pa.Table) else con.sql(
        f"SELECT rank, t0, t1, cls FROM ({src})", params=params or None).to_arrow_table()
    rank = cols.column("rank").to_numpy().astype(np.int64, copy=False)
    t0 = cols.column("t0").to_numpy().astype(np.int64, copy=False)
    t1 = cols.column("t1").to_numpy().astype(np.int64, copy=False)
    def is_cls(name: str) -> np.ndarray:
        same = pc.fill_null(pc.equal(cols.column("cls"), name), False)
        return same.to_numpy(zero_copy_only=False)

    w = np.where(is_cls("compute"), _BITS["compute"],
                 np.where(is_cls("comm"), _BITS["comm"], _BITS["memcpy"]))
    r2, t2, d2 = np.concatenate([rank, rank]), np.concatenate([t0, t1]), np.concatenate([w, -w])
    # Only the state after an instant's last boundary is kept, and it does not depend on the
    # order of the boundaries at that instant: sort by (rank, t) alone.
    order = np.lexsort((t2, r2))
    r2, t2 = r2[order], t2[order]
    # Each rank's deltas sum to zero, so one cumulative sum over all ranks is each rank's own.
    state = np.cumsum(d2[order])
    # One row per (rank, instant): the state after its last boundary (every counter >= 0).
    keep = np.ones(len(t2), dtype=bool)
    keep[:-1] = (t2[1:] != t2[:-1]) | (r2[1:] != r2[:-1])
    r2, t2, state = r2[keep], t2[keep], state[keep]
    last = np.ones(len(t2), dtype=bool)
    last[:-1] = r2[1:] != r2[:-1]
    length = np.zeros(len(t2), dtype=np.int64)
    length[:-1] = t2[1:] - t2[:-1]
    length[last] = 0
    c = state >> _SHIFT["compute"]
    m = (state >> _SHIFT["comm"]) & _FIELD
    y = state & _FIELD
    flags = {"compute": c > 0, "exposed_comm": (m > 0) & (c == 0),
             "overlapped_comm": (m > 0) & (c > 0),
             "exposed_memcpy": (y > 0) & (c == 0) & (m == 0), "busy": (c + m + y) > 0}
    starts = np.flatnonzero(np.concatenate([[True], r2[1:] != r2[:-1]])) if len(t2) else []
    data = {"rank": pa.array(r2.astype(np.int32)), "t": pa.array(t2),
            "len": pa.array(length, mask=last), "c": pa.array(c), "m": pa.array(m),
            "y": pa.array(y)}
    for name, flag in flags.items():
        part = length * flag
        # One running sum restarting at each rank: its first segment carries minus the
        # previous rank's total.
        before = part.copy()
        if len(starts) > 1:
            before[starts[1:]] -= np.add.reduceat(part, starts)[:-1]
        np.cumsum(before, out=before)
        before -= part
        data[f"cum_{name}"] = pa.array(before)
    con.register("_tl_arrow_segments", pa.table(data))
    try:
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM _tl_arrow_segments")
    finally:
        con.unregister("_tl_arrow_segments")


def measure_at(alias: str, point: str, measure: str) -> str:
    """SQL for the running total of `measure` at time `point`, from the segment `alias` that an
    ASOF join found at or before it (NULL-safe: 0 before a rank's first segment)."""
    return (f"coalesce({alias}.cum_{measure} + least({point} - {alias}.t, "
            f"coalesce({alias}.len, 0)) * ({MEASURES[measure].format(a=alias)})::INTEGER, 0)")


def window_sql(segments: str, windows: str) -> str:
    """breakdown_sql's columns for each window of `windows` (rank, ..., w0, w1; other columns are
    passed through) from materialized segments: two ASOF lookups per window."""
    parts = {k: f"{measure_at('e', 'w.w1', k)} - {measure_at('b', 'w.w0', k)}" for k in MEASURES}
    return f"""
    SELECT w.*, w.w1 - w.w0 AS window_ns, w.w0 AS t_first, w.w1 AS t_last,
           {parts['compute']} AS compute_ns,
           {parts['exposed_comm']} AS exposed_comm_ns,
           {parts['overlapped_comm']} AS overlapped_comm_ns,
           ({parts['exposed_comm']}) + ({parts['overlapped_comm']}) AS comm_ns,
           {parts['exposed_memcpy']} AS exposed_memcpy_ns,
           (w.w1 - w.w0) - ({parts['busy']}) AS idle_ns
    FROM ({windows}) w
    ASOF LEFT JOIN {segments} e ON e.rank = w.rank AND w.w1 >= e.t
    ASOF LEFT JOIN {segments} b ON b.rank = w.rank AND w.w0 >= b.t
    """


def covered(con: duckdb.DuckDBPyConnection, segments: str, measure: str, rank: np.ndarray,
            s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
    """For each span (rank[i], [s0[i], s1[i]]), the time in the state `measure` (one of
    MEASURES), from materialized segments: the running total at s1 minus that at s0. Only the
    segments in that state are read (the running total does not move elsewhere)."""
    seg = _read(con, f"SELECT rank, t, coalesce(len, 0) AS len, cum_{measure} AS cum "
                     f"FROM {segments} s WHERE {MEASURES[measure].format(a='s')}")
    rank = np.asarray(rank, dtype=np.int64)
    return (_running_total(seg, "cum", None, rank, np.asarray(s1))
            - _running_total(seg, "cum", None, rank, np.asarray(s0)))


def window_totals(con: duckdb.DuckDBPyConnection, segments: str, rank: np.ndarray,
                  w0: np.ndarray, w1: np.ndarray) -> dict[str, np.ndarray]:
    """window_sql's measures (window_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns,
    comm_ns, exposed_memcpy_ns, idle_ns) for each window (rank[i], [w0[i], w1[i]]), from
    materialized segments, in numpy: one read of the segments and a binary search per window
    end, where window_sql's ASOF joins sort both sides on every call."""
    seg = _read(con, f"SELECT rank, t, coalesce(len, 0) AS len, c, m, y, "
                     f"{', '.join('cum_' + k for k in MEASURES)} FROM {segments}")
    c, m, y = seg["c"] > 0, seg["m"] > 0, seg["y"] > 0
    flags = {"compute": c, "exposed_comm": m & ~c, "overlapped_comm": m & c,
             "exposed_memcpy": y & ~c & ~m, "busy": c | m | y}
    rank = np.asarray(rank, dtype=np.int64)
    w0, w1 = np.asarray(w0, dtype=np.int64), np.asarray(w1, dtype=np.int64)
    part = {k: _running_total(seg, f"cum_{k}", flags[k], rank, w1)
            - _running_total(seg, f"cum_{k}", flags[k], rank, w0) for k in MEASURES}
    return {"window_ns": w1 - w0, "compute_ns": part["compute"],
            "exposed_comm_ns": part["exposed_comm"],
            "overlapped_comm_ns": part["overlapped_comm"],
            "comm_ns": part["exposed_comm"] + part["overlapped_comm"],
            "exposed_memcpy_ns": part["exposed_memcpy"], "idle_ns": (w1 - w0) - part["busy"]}


def _read(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, np.ndarray]:
    """Columns of segments (rank, t, ...) as int64 numpy arrays, in (rank, t) order."""
    tbl = con.sql(sql).to_arrow_table()
    cols = {k: tbl.column(k).to_numpy().astype(np.int64, copy=False) for k in tbl.column_names}
    sr, st = cols["rank"], cols["t"]
    # A temporary table scans in insertion order, which is this one; sort if it ever is not.
    if len(sr) > 1 and not ((sr[1:] > sr[:-1]) | ((sr[1:] == sr[:-1]) & (st[1:] > st[:-1]))).all():
        order = np.lexsort((st, sr))
        cols = {k: v[order] for k, v in cols.items()}
    return cols


def _running_total(seg: dict[str, np.ndarray], cum: str, flag: np.ndarray | None,
                   rank: np.ndarray, point: np.ndarray) -> np.ndarray:
    """measure_at in numpy: for each (rank[i], point[i]), the running total `cum` of the
    segment at or before the point plus the part of that segment up to it (if it is in the
    state: `flag`, None for all); 0 before a rank's first segment."""
    out = np.zeros(len(rank), dtype=np.int64)
    sr, st = seg["rank"], seg["t"]
    for rk in np.unique(rank):
        lo, hi = np.searchsorted(sr, rk, "left"), np.searchsorted(sr, rk, "right")
        mine = np.flatnonzero(rank == rk)
        j = np.searchsorted(st[lo:hi], point[mine], "right") - 1 + lo
        ok = j >= lo
        jj, at = j[ok], point[mine[ok]]
        inside = np.minimum(at - st[jj], seg["len"][jj])
        out[mine[ok]] = seg[cum][jj] + (inside if flag is None else inside * flag[jj])
    return out


def host_compute_sql(src: str, keys: str) -> str:
    """Host compute intervals: per KEYS (which must include the thread), the time covered by a
    cpu_op (cls = 'compute') and by no communication op (cls = 'comm') of the same thread, so a
    blocking wait inside an operator is not counted as compute (FACTS.md section 2)."""
    return f"""
    SELECT {keys}, t AS t0, t + len AS t1
    FROM ({segments_sql(src, keys)})
    WHERE c > 0 AND m = 0 AND len > 0
    """
