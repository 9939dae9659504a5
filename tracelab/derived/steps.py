"""Steps as every surface counts them (docs/metrics.md, "Steps").

Per rank, in step order: a step starts at its ProfilerStep#N span's start, or at the end of the
steps before it if that is later (their device work may still run); it ends at the next step's
start, the last step at the later of its span's end and the end of the device work launched in
it. This is the TensorBoard plugin's step boundary (host span, extended to the device work it
launched, never before the previous step's end) made to tile: a gap between two spans belongs to
the earlier step, so per-step figures add up to the profiled run. A rank without ProfilerStep
spans is one step (step 0) over its whole trace.

Steps are matched across ranks by number; `ordinal` numbers the run's distinct steps from 0, and
the first tracelab.defaults.WARMUP_STEPS of them are warm-up unless that would leave none.
"""

from __future__ import annotations

import duckdb

from tracelab.defaults import WARMUP_STEPS

STEP_SPANS_SQL = """
WITH s AS (
    SELECT rank, step, start_ns AS hs, end_ns AS he, device_end_ns AS de, 'profiler_step' AS src
    FROM steps WHERE run_id = $run
),
whole AS (
    SELECT rank, 0 AS step, min(ts_ns) AS hs, max(ts_ns + dur_ns) AS he,
           max(ts_ns + dur_ns) FILTER (WHERE on_device) AS de, 'whole_trace' AS src
    FROM events WHERE run_id = $run AND rank NOT IN (SELECT rank FROM s) GROUP BY rank
),
a AS (SELECT *, greatest(he, coalesce(de, he)) AS e FROM (FROM s UNION ALL FROM whole)),
t AS (
    SELECT *, greatest(hs, coalesce(max(e) OVER (PARTITION BY rank ORDER BY step
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), hs)) AS st
    FROM a
),
u AS (
    SELECT *, coalesce(lead(st) OVER (PARTITION BY rank ORDER BY step), greatest(e, st)) AS en,
           dense_rank() OVER (ORDER BY step) - 1 AS ordinal
    FROM t
),
n AS (SELECT count(DISTINCT step) AS steps FROM u)
SELECT $run, u.rank, u.step, u.ordinal, u.ordinal >= $warmup OR n.steps <= $warmup, u.src,
       u.hs, u.he, u.de, u.st - o.offset_ns, u.en - o.offset_ns, u.en - u.st
FROM u CROSS JOIN n JOIN clock_offsets o ON o.run_id = $run AND o.rank = u.rank
"""


def derive(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill step_spans for the run (after clock_offsets)."""
    con.execute(f"INSERT INTO step_spans {STEP_SPANS_SQL}", {"run": run_id, "warmup": WARMUP_STEPS})
