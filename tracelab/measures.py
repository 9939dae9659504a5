"""Run-level numbers that several surfaces show, each written once as SQL over the derived layer.

The analyzers, the views (the Runs page) and the report read these fragments; none writes its own
average. Each binds named parameters only (`$run`, `$min_ordinal`); docs/metrics.md defines the
numbers.
"""

from __future__ import annotations

from tracelab.derived.collectives import BUS_FACTOR_SQL


def step_time_sql(run: str = "$run", min_ordinal: str = "$min_ordinal") -> str:
    """The run's **step time**: the mean over its steady steps (ordinal >= min_ordinal) of the
    job's step time, job_steps.dur_ns (the mean over ranks of their tiled steps); docs/metrics.md,
    "Steps". A scalar subquery, NULL when the run has no steady step. `run` and `min_ordinal` are
    SQL expressions: bind parameters (the default) or a query's columns, never values."""
    return f"(SELECT avg(dur_ns) FROM job_steps WHERE run_id = {run} AND ordinal >= {min_ordinal})"


#: The step time of run $run with steps from ordinal $min_ordinal steady.
STEP_TIME_SQL = step_time_sql()

#: One row per matched collective call (matched_collectives, one row per match_key) with its
#: bandwidth by the nccl-tests convention (PERFORMANCE.md; docs/metrics.md, "Matched
#: collectives"): algbw = bytes / transfer time, busbw = algbw x the op's bus factor
#: (derived.collectives.BUS_FACTOR_SQL; n = ranks in the group). bytes per ns is GB/s. An
#: all-to-all's bytes are its all_to_all_ranks.call_bytes (the busiest rank's larger buffer,
#: which bounds an uneven call; one rank's input only for an even one), so its busbw here is
#: all_to_all_ranks.busbw_gbps; matched_collectives.bytes (one rank's input) only where the
#: call has no all_to_all_ranks size. A relation binding $run; calls without a transfer time
#: or size have NULL bandwidths.
COLLECTIVE_BANDWIDTH_SQL = f"""(
    SELECT match_key, op, pg_name, step, bytes, n, transfer_ns, source,
           bytes * ({BUS_FACTOR_SQL}) AS bus_bytes,
           CASE WHEN transfer_ns > 0 THEN bytes / transfer_ns END AS algbw_gbps,
           CASE WHEN transfer_ns > 0 THEN bytes / transfer_ns * ({BUS_FACTOR_SQL}) END
               AS busbw_gbps
    FROM (
        SELECT m.match_key, any_value(m.op) AS op, any_value(m.pg_name) AS pg_name,
               min(m.step) AS step,
               coalesce(any_value(a.call_bytes), any_value(m.bytes)) AS bytes,
               any_value(m.group_size) AS n, any_value(m.transfer_ns) AS transfer_ns,
               any_value(m.source) AS source
        FROM matched_collectives m
        LEFT JOIN (SELECT match_key, any_value(call_bytes) AS call_bytes FROM all_to_all_ranks
                   WHERE run_id = $run AND match_key IS NOT NULL GROUP BY match_key) a
            ON m.op = 'all_to_all' AND a.match_key = m.match_key
        WHERE m.run_id = $run GROUP BY m.match_key
    )
)"""


#: Per steady step (ordinal >= $min_ordinal) and parallel dimension: the dimension's exposed
#: communication, transfer and wait, over the step time, pooled over ranks (the derived view
#: job_step_dim_shares; docs/metrics.md, "Process groups and parallel dimensions"). Rows:
#: step, dim, share. The report samples it per step; the breakdown shows its median.
DIM_COMM_SHARES_SQL = """
SELECT step, dim, transfer_share + wait_share AS share FROM job_step_dim_shares
WHERE run_id = $run AND ordinal >= $min_ordinal ORDER BY step, dim
"""
