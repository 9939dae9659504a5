"""What the host was doing while a rank waited on it: the named host spans under its 'host' time.

Shared by the analyzers that explain host-bound time (breakdown's HOST_BOUND, stragglers' kind
of a straggler): per name of a host span on the rank's step thread (a user annotation such as
`injected_delay`, a DataLoader's `enumerate(DataLoader)#...`, an operator, a runtime call, a
Python function), how much of the 'host' time it overlaps. Nested spans each count their own
overlap, so the figures say where host time went, not shares that add up.
"""

from __future__ import annotations

from typing import Any

import duckdb

from tracelab.derived.sqlrows import first

from tracelab.analyzers._common import RunContext, rows


_SQL = """
WITH seg AS (
    SELECT rank, start_ns, end_ns FROM time_parts
    WHERE run_id = $run AND part = 'host' AND ($rank IS NULL OR rank = $rank)
      AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal)
),
main AS (SELECT DISTINCT rank, tid FROM events
         WHERE run_id = $run AND NOT on_device AND name LIKE 'ProfilerStep#%'),
ev AS (
    SELECT e.rank, e.name, e.ts_ns - o.offset_ns AS t0, e.ts_ns + e.dur_ns - o.offset_ns AS t1
    FROM events e JOIN clock_offsets o ON o.run_id = e.run_id AND o.rank = e.rank
    WHERE e.run_id = $run AND NOT e.on_device AND e.name NOT LIKE 'ProfilerStep#%'
      AND e.category IN ('annotation', 'cpu_op', 'runtime', 'python', 'sync', 'other')
      AND ($rank IS NULL OR e.rank = $rank)
      AND (NOT EXISTS (SELECT 1 FROM main) OR (e.rank, e.tid) IN (SELECT (rank, tid) FROM main))
),
ov AS (
    SELECT ev.name, least(seg.end_ns, ev.t1) - greatest(seg.start_ns, ev.t0) AS ns
    FROM seg JOIN ev ON ev.rank = seg.rank AND ev.t0 < seg.end_ns AND ev.t1 > seg.start_ns
)
SELECT name, sum(ns) AS ns FROM ov GROUP BY name ORDER BY ns DESC, name LIMIT $top
"""


def host_total(con: duckdb.DuckDBPyConnection, ctx: RunContext, rank: int | None = None) -> int:
    """Host time over the steady steps (of `rank`, or every rank), ns."""
    row = first(con.execute(
        """SELECT coalesce(sum(host_ns), 0) FROM step_parts
           WHERE run_id = $run AND ordinal >= $min_ordinal AND ($rank IS NULL OR rank = $rank)""",
        {**ctx.params, "rank": rank}))
    return int(row[0]) if row else 0


def host_activity(con: duckdb.DuckDBPyConnection, ctx: RunContext, rank: int | None = None,
                  top: int = 5) -> list[dict[str, Any]]:
    """The `top` named host spans by their overlap with the steady steps' host time (of
    `rank`, or every rank): rows {name, ns} (total ns over those steps and ranks), largest
    first."""
    return rows(con, _SQL, {**ctx.params, "rank": rank, "top": top})
