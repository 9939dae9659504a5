"""Interval algebra: the union of intervals in numpy, and the SQL sweep behind HTA's temporal
breakdown.

The union of intervals is defined once, by the SQL macro interval_union
(tracelab/derived/sql/_macros.sql): intervals are half-open [t0, t1) in ns, touching intervals
merge (like HTA's merge_kernel_intervals), empty ones are dropped. `union` is the same
definition in numpy, for the one caller that needs arrays of whole runs (the parts' sweep,
tracelab.derived.parts: DuckDB's windowed running max costs about a microsecond a row there,
numpy a few nanoseconds); tests/analyzers/test_schedules_intervals.py tests the two equal. The sweep
(`segments_sql`, `breakdown_sql`) serves HTA's own definitions (docs/metrics.md) in the
breakdown analyzer's HTA-compatible mode and host compute; the lost-time model has its own
sweep (tracelab.derived.parts) over unions made here.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

I64 = npt.NDArray[np.int64]


def int64s(table: pa.Table, name: str) -> np.ndarray:
    """A column of an Arrow table as int64 numpy (no copy where it is one already)."""
    return table.column(name).to_numpy().astype(np.int64, copy=False)


def union(key: I64, t0: I64, t1: I64) -> tuple[I64, I64, I64]:
    """Merged intervals per key: (key, t0, t1) sorted by key then start, disjoint and
    non-touching within a key. Empty intervals (t1 <= t0) are dropped."""
    key, t0, t1 = (np.asarray(a, dtype=np.int64) for a in (key, t0, t1))
    keep = t1 > t0
    key, t0, t1 = key[keep], t0[keep], t1[keep]
    if not len(key):
        return key, t0, t1
    order = np.lexsort((t0, key))
    key, t0, t1 = key[order], t0[order], t1[order]
    # Running max of the end within each key: shift each key's times past the previous key's,
    # so that one global running max never crosses keys.
    first = np.concatenate([[True], key[1:] != key[:-1]])
    group = np.cumsum(first) - 1
    lo = np.minimum.reduceat(t0, np.flatnonzero(first))
    hi = np.maximum.reduceat(t1, np.flatnonzero(first))
    span = hi - lo + 1
    base = np.concatenate([[0], np.cumsum(span)[:-1]])[group] - lo[group]
    s, e = t0 + base, t1 + base
    run_end = np.maximum.accumulate(e)
    prev = np.empty_like(run_end)
    prev[0] = np.iinfo(np.int64).min
    prev[1:] = run_end[:-1]
    new = first | (s > prev)
    starts = np.flatnonzero(new)
    ends = np.concatenate([starts[1:], [len(s)]]) - 1
    return key[starts], t0[starts], run_end[ends] - base[ends]


def total(t0: I64, t1: I64) -> int:
    """Length of the union of [t0, t1) intervals."""
    _, a, b = union(np.zeros(len(t0), dtype=np.int64), t0, t1)
    return int((b - a).sum())


#: Interval classes of the HTA sweep.
CLASSES = ("compute", "comm", "memcpy")

#: Class counters of the SQL sweep are packed into one DOUBLE (compute * 2^34 + comm * 2^17 +
#: memcpy) so that a single running sum gives all three: every partial sum is an integer below
#: 2^53, exact in a double, as long as fewer than 2^17 intervals of one class overlap.
_SHIFT = {"compute": 34, "comm": 17, "memcpy": 0}
_PACK = {k: float(1 << v) for k, v in _SHIFT.items()}


def segments_sql(src: str, keys: str) -> str:
    """Elementary segments of the sweep over `src` (columns: KEYS..., t0, t1, cls with cls one
    of compute, comm, memcpy) per KEYS: (KEYS..., t, len, c, m, y) with c/m/y the number of
    compute/comm/memcpy intervals covering [t, t + len)."""
    w = (
        f"CASE cls WHEN 'compute' THEN {_PACK['compute']} WHEN 'comm' THEN {_PACK['comm']} "
        f"ELSE {_PACK['memcpy']} END"
    )
    return f"""
    SELECT {keys}, t, len,
           (s // {_PACK["compute"]})::BIGINT AS c,
           ((s % {_PACK["compute"]}) // {_PACK["comm"]})::BIGINT AS m,
           (s % {_PACK["comm"]})::BIGINT AS y
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
    """HTA's temporal breakdown and overlap per KEYS over each group's [first start, last end]:
    window_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns, comm_ns, exposed_memcpy_ns,
    idle_ns, t_first, t_last; compute + exposed comm + exposed memcpy + idle = window."""
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
    FROM ({segments_sql(src, keys)})
    GROUP BY ALL
    """


#: Host operators per thread: 'compute' for cpu_ops, 'comm' for communication *operators*
#: (c10d::*, record_param_comms), whose span is the thread's own wait. gloo:* annotations are
#: not operators: on gloo they time the transfer on a worker thread while compute may run on
#: the main one. Named parameter: $run.
HOST_OPS_SQL = """SELECT rank, step, tid, ts_ns AS t0, ts_ns + dur_ns AS t1,
                         CASE WHEN category = 'cpu_op' THEN 'compute' ELSE 'comm' END AS cls
                  FROM events
                  WHERE run_id = $run AND NOT on_device AND lower(cat) IN ('cpu_op', 'operator')
                    AND category IN ('cpu_op', 'communication')"""


def host_compute_sql(src: str, keys: str) -> str:
    """Host compute intervals: per KEYS (which must include the thread), the time covered by a
    cpu_op (cls = 'compute') and by no communication op (cls = 'comm') of the same thread, so a
    blocking wait inside an operator is not counted as compute (docs/metrics.md, "The lost-time model")."""
    return f"""
    SELECT {keys}, t AS t0, t + len AS t1
    FROM ({segments_sql(src, keys)})
    WHERE c > 0 AND m = 0 AND len > 0
    """
