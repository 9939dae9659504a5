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

from tracelab.analyzers._common import RunContext, rows
from tracelab.derived.sqlrows import first

#: The host segments as a cumulative function H(t) (host time before t on the rank), so a span's
#: overlap with them is H(t1) - H(t0): two ASOF joins, linear in spans and segments, where an
#: interval join would pair every span with every segment of its rank.
_SQL = """
WITH s0 AS (
    SELECT rank, start_ns, end_ns - start_ns AS len FROM time_parts
    WHERE run_id = $run AND part = 'host' AND ($rank IS NULL OR rank = $rank)
      AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal)
),
seg AS (
    SELECT rank, start_ns, len,
           sum(len) OVER (PARTITION BY rank ORDER BY start_ns ROWS UNBOUNDED PRECEDING) - len
               AS before
    FROM s0
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
a AS (
    SELECT ev.rank, ev.name, ev.t1, coalesce(g.before + least(ev.t0 - g.start_ns, g.len), 0) AS h0
    FROM ev ASOF LEFT JOIN seg g ON ev.rank = g.rank AND ev.t0 >= g.start_ns
),
b AS (
    SELECT a.name, coalesce(g.before + least(a.t1 - g.start_ns, g.len), 0) - a.h0 AS ns
    FROM a ASOF LEFT JOIN seg g ON a.rank = g.rank AND a.t1 >= g.start_ns
)
SELECT name, sum(ns) AS ns FROM b WHERE ns > 0 GROUP BY name ORDER BY ns DESC, name LIMIT $top
"""


def host_total(con: duckdb.DuckDBPyConnection, ctx: RunContext, rank: int | None = None) -> int:
    """Host time over the steady steps (of `rank`, or every rank), ns."""
    row = first(
        con.execute(
            """SELECT coalesce(sum(host_ns), 0) FROM step_parts
           WHERE run_id = $run AND ordinal >= $min_ordinal AND ($rank IS NULL OR rank = $rank)""",
            {**ctx.params, "rank": rank},
        )
    )
    return int(row[0]) if row else 0


def host_activity(
    con: duckdb.DuckDBPyConnection, ctx: RunContext, rank: int | None = None, top: int = 5
) -> list[dict[str, Any]]:
    """The `top` named host spans by their overlap with the steady steps' host time (of
    `rank`, or every rank): rows {name, ns} (total ns over those steps and ranks), largest
    first."""
    return rows(con, _SQL, {**ctx.params, "rank": rank, "top": top})
