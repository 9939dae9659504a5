"""Run bookkeeping in the store: finding a run by name, listing runs, deleting one."""

from __future__ import annotations

import duckdb

from tracelab.derived import FILE_TABLES as DERIVED_FILE_TABLES
from tracelab.derived import TABLES as DERIVED_TABLES
from tracelab.derived import part_files
from tracelab.errors import RunNotFoundError
from tracelab.store.files import FILE_KINDS, refresh_file_views
from tracelab.store.versions import first_row


def run_id(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """The id of the run called `name`; a clear error listing the runs that exist otherwise."""
    row = first_row(con.execute("SELECT run_id FROM runs WHERE name = ?", [name]))
    if row is None:
        names = [r[0] for r in con.execute("SELECT name FROM runs ORDER BY run_id").fetchall()]
        known = ", ".join(names[:20]) or "none: ingest some traces first"
        raise RunNotFoundError(f"no run named {name!r} in the store. Runs: {known}.")
    return int(row[0])


def resolve_run(con: duckdb.DuckDBPyConnection, name: str | None) -> tuple[int, str]:
    """(run_id, name) for `name`, or for the newest run when `name` is None."""
    if name is not None:
        return run_id(con, name), name
    row = first_row(con.execute("SELECT run_id, name FROM runs ORDER BY run_id DESC LIMIT 1"))
    if row is None:
        raise RunNotFoundError("the store holds no runs yet. Ingest traces with `tracelab ingest`.")
    return int(row[0]), str(row[1])


#: Tables (and the events and memory views) holding per-run rows, deleted with the run (derived
#: ones first).
RUN_TABLES = DERIVED_TABLES + (
    "hang_verdicts",
    "events",
    "steps",
    "lanes",
    "collectives",
    "memory",
    "memory_peaks",
    "process_group_configs",
    "ranks",
    "runs",
)
#: The tables that hold a run's rows: those of RUN_TABLES, and the catalog of the run's files
#: in place of the views over them (what delete_run deletes from, what
#: tracelab.store.staged.move_run copies; `runs` last, the order a deletion takes).
ROW_TABLES = tuple(
    t for t in RUN_TABLES if t not in (*FILE_KINDS, "ranks", "runs", *DERIVED_FILE_TABLES)
) + (
    "parquet_files",
    "ranks",
    "runs",
)


def delete_run(con: duckdb.DuckDBPyConnection, rid: int, *, refresh_views: bool = True) -> None:
    """Delete every row of one run, and unlist its Parquet files (removed from the store folder
    when the writer closes the store: tracelab.store.files.sweep). Call inside a transaction to
    make it atomic with more work; `refresh_views=False` leaves the views over the files to that
    work (which must replace them before it commits)."""
    for table in ROW_TABLES:
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [rid])
    if refresh_views:
        refresh_file_views(con)
        part_files.refresh_view(con)


def list_runs(con: duckdb.DuckDBPyConnection) -> list[dict[str, object]]:
    """Runs with their rank count, world size, step count and duration (first event start to
    last event end, each rank on its own clock), newest first. The duration comes from each
    rank's extent (rank_extents); from the events only for a run without one (its parts could
    not be derived): scanning every run's events took 2.2 s for one run of 10,000 ranks."""
    rows = con.execute(
        """
        SELECT r.run_id, r.name, r.created_at, r.rank_count, r.world_size,
               (SELECT count(DISTINCT s.step) FROM steps s WHERE s.run_id = r.run_id) AS steps,
               (SELECT max(x.end_ns) - min(x.first_ns) FROM rank_extents x
                 WHERE x.run_id = r.run_id) AS span_ns,
               json_array_length(r.skipped) AS skipped_files
        FROM runs r ORDER BY r.run_id DESC
        """
    ).fetchall()
    keys = ("run_id", "name", "created_at", "ranks", "world_size", "steps", "span_ns", "skipped")
    runs = [dict(zip(keys, row, strict=True)) for row in rows]
    for run in runs:
        if run["span_ns"] is None:
            got = con.execute(
                "SELECT max(ts_ns + dur_ns) - min(ts_ns) FROM events WHERE run_id = ?",
                [run["run_id"]],
            ).fetchall()
            run["span_ns"] = got[0][0] if got else None
    return runs
