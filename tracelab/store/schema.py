"""The store's schema: its DDL (the base tables in schema/tables.sql; the derived layer's tables
and views, which tracelab.derived defines in tracelab/derived/sql/), their column comments
copied into DuckDB's catalog, and the creation (or version check) of the schema in a database."""

from __future__ import annotations

from importlib import resources

import duckdb

from tracelab.derived import part_files
from tracelab.derived import schema_sql as derived_schema_sql
from tracelab.derived.sqlcomments import CREATE_RE as _CREATE
from tracelab.derived.sqlcomments import apply_comments as apply_comments
from tracelab.derived.sqlfiles import rollback
from tracelab.errors import StoreError
from tracelab.store.versions import (
    DERIVED_VERSION,
    SCHEMA_VERSION,
    check_version,
    record_duckdb_storage,
)

#: The store's own schema files, executed before the derived layer's DDL.
SCHEMA_FILES = ("tables.sql",)


def schema_sql() -> str:
    """The DDL of the current schema version (documented column by column in the files): the
    base tables, then the derived layer's (tracelab.derived.schema_sql)."""
    base = [
        resources.files("tracelab").joinpath(f"store/schema/{name}").read_text()
        for name in SCHEMA_FILES
    ]
    return "\n".join([*base, derived_schema_sql()])


def apply_view_comments(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Copy the comments of one table or view of the store's own schema files into DuckDB's
    catalog again (a replaced view loses them)."""
    sql = "\n".join(
        resources.files("tracelab").joinpath(f"store/schema/{f}").read_text() for f in SCHEMA_FILES
    )
    apply_comments(con, sql, only=name)


def rederive_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the derived tables (every run's rows, time_parts' files unlisted) and create them as
    this tracelab defines them; their rows are recomputed from the base tables by
    tracelab.derived, run by run (no event is touched). The stored derived version is removed
    until mark_derived_current: a rederive stopped between runs leaves a store that is refused
    with the command to finish it, not one that reads the runs not yet recomputed as empty."""
    sql = derived_schema_sql()
    con.execute("BEGIN")
    try:
        made = {m.group(1) for line in sql.splitlines() if (m := _CREATE.match(line.strip()))}
        # As the store holds them, which may differ from this tracelab's (time_parts was a
        # table before it became a view over Parquet files): views first.
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        for name in sorted(made, key=lambda n: n not in views):
            con.execute(f"DROP {'VIEW' if name in views else 'TABLE'} IF EXISTS {name}")
        con.execute(sql)
        apply_comments(con, sql)
        con.execute("DELETE FROM parquet_files WHERE kind = ?", [part_files.KIND])
        part_files.refresh_view(con)
        con.execute("DELETE FROM tracelab_meta WHERE key = 'derived_version'")
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def mark_derived_current(con: duckdb.DuckDBPyConnection) -> None:
    """Record that every run's derived tables are this tracelab's (after a rederive)."""
    con.execute(
        "INSERT OR REPLACE INTO tracelab_meta VALUES ('derived_version', ?)",
        [str(DERIVED_VERSION)],
    )


def ensure_schema(
    con: duckdb.DuckDBPyConnection, path: str = "<store>", *, check_derived: bool = True
) -> None:
    """Create the schema in an empty database, or check the version of an existing one."""
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tracelab_meta'"
    ).fetchall()[0][0]
    if has_meta:
        check_version(con, path, check_derived)
        return
    others = con.execute("SELECT count(*) FROM information_schema.tables").fetchall()[0][0]
    if others:
        raise StoreError(
            f"{path}: this DuckDB file holds other tables and is not a tracelab store. "
            "Use a new file for --db."
        )
    con.execute("BEGIN")
    sql = schema_sql()
    con.execute(sql)
    apply_comments(con, sql)
    con.execute(
        "INSERT INTO tracelab_meta VALUES ('schema_version', ?), ('derived_version', ?)",
        [str(SCHEMA_VERSION), str(DERIVED_VERSION)],
    )
    record_duckdb_storage(con)
    con.execute("COMMIT")
