"""Every DuckDB connection tracelab opens (the store, a staged store, a batch's in-memory
database): `connect`, with the planner settings its queries rely on.

`asof_loop_join_threshold = 0`: DuckDB plans an ASOF join whose left side it estimates at 64 rows
or fewer as a join on the equality keys followed by an aggregate, which is quadratic in the rows
of each key. Its estimates of a filtered CTE can be that low whatever the real size: the
Operators page's kernel query (each runtime launch joined to the operator around it, per
thread) estimated its 32,335 launches below 64 on a store of 14 runs, built 457,804,805 rows
and took 12.5 s for the shared real GPU trace's one rank, against 0.06 s as an ASOF join.
Set GLOBAL: a connection's cursors (the app's) have their own settings, which start from the
database's, not from the connection's.
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
            con.execute(f"SET GLOBAL {name} = {value!r}")
    except BaseException:
        con.close()
        raise
    return con
