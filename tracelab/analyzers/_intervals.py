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


def segments_sql(src: str, keys: str) -> str:
    """Elementary segments of the sweep over `src` (columns: KEYS..., t0, t1, cls) per KEYS:
    (KEYS..., t, len, c, m, y) with c/m/y the number of compute/comm/memcpy intervals covering
    [t, t + len)."""
    return f"""
    SELECT {keys}, t, lead(t) OVER w - t AS len,
           sum(dc) OVER w AS c, sum(dm) OVER w AS m, sum(dy) OVER w AS y
    FROM (
        SELECT {keys}, t, sum(dc) AS dc, sum(dm) AS dm, sum(dy) AS dy
        FROM (
            SELECT {keys}, t0 AS t, (cls = 'compute')::INTEGER AS dc,
                   (cls = 'comm')::INTEGER AS dm, (cls = 'memcpy')::INTEGER AS dy FROM ({src})
            UNION ALL
            SELECT {keys}, t1 AS t, -(cls = 'compute')::INTEGER, -(cls = 'comm')::INTEGER,
                   -(cls = 'memcpy')::INTEGER FROM ({src})
        )
        GROUP BY ALL
    )
    WINDOW w AS (PARTITION BY {keys} ORDER BY t ROWS UNBOUNDED PRECEDING)
    """


def breakdown_sql(src: str, keys: str) -> str:
    """Per KEYS: window_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns, comm_ns,
    exposed_memcpy_ns, idle_ns, t_first, t_last. compute + exposed comm + exposed memcpy + idle
    = window."""
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


def host_compute_sql(src: str, keys: str) -> str:
    """Host compute intervals: per KEYS (which must include the thread), the time covered by a
    cpu_op (cls = 'compute') and by no communication op (cls = 'comm') of the same thread, so a
    blocking wait inside an operator is not counted as compute (FACTS.md section 2)."""
    return f"""
    SELECT {keys}, t AS t0, t + len AS t1
    FROM ({segments_sql(src, keys)})
    WHERE c > 0 AND m = 0 AND len > 0
    """
