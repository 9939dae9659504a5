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
from tracelab.derived import sqlfiles


def derive(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill step_spans for the run (after clock_offsets): tracelab/derived/sql/step_spans.sql.
    The ranks without steps are named to it, so that a run whose every rank has steps reads no
    events (an empty list given as a value lets DuckDB drop the read: 0.5 s of 2,000 ranks;
    with any stepless rank every rank's file is opened, as before)."""
    stepless = [
        int(r)
        for (r,) in con.execute(
            "SELECT rank FROM ranks WHERE run_id = $run "
            "EXCEPT SELECT rank FROM steps WHERE run_id = $run ORDER BY rank",
            {"run": run_id},
        ).fetchall()
    ]
    sqlfiles.run(con, "step_spans", {"run": run_id, "warmup": WARMUP_STEPS, "stepless": stepless})
