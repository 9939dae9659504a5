"""Every DuckDB connection tracelab opens (the store, a staged store, a batch's in-memory
database): `connect`, with the planner settings its queries rely on.

`asof_loop_join_threshold = 0`: DuckDB plans an ASOF join whose left side it estimates at 64 rows
or fewer as a nested loop join (every pair of rows tested) followed by an aggregate. Its
estimates of a query over the `events` view can be that low whatever the real size, and vary
between processes: the Operators page's kernel query (each runtime launch joined to the
operator around it on its thread) estimated the shared real GPU trace's 32,335 launches at a
few rows in a store of 14 runs, joined 457,804,805 rows and took 12.5 s (the page 12.3 s)
against 0.06 s as an ASOF join; for the 8-rank set, 3,662,438,440 rows and 341 s.
Set GLOBAL: a connection's cursors (the app's) have their own settings, which start from the
database's, not from the connection's. Not set where the database has it already: a
connection with `lock_configuration` (tracelab sql's) refuses any SET, and another open of
the same file in the process shares its database.
"""

from __future__ import annotations

import duckdb

#: (name, value) of each setting, applied to the whole database instance.
SETTINGS = (("asof_loop_join_threshold", 0),)


def connect(database: str = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """duckdb.connect(database, read_only=...) with SETTINGS applied."""
    con = duckdb.connect(database, read_only=read_only)
    try:
        for name, value in SETTINGS:
            if con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0] != value:
                con.execute(f"SET GLOBAL {name} = {value!r}")
    except BaseException:
        con.close()
        raise
    return con
