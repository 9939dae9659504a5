"""The store's schema: its DDL (the base tables in schema/tables.sql; the derived layer's tables
and views, which tracelab.derived defines in tracelab/derived/sql/), their column comments
copied into DuckDB's catalog, and the creation (or version check) of the schema in a database."""

from __future__ import annotations

import re
from importlib import resources

import duckdb

from tracelab.derived import schema_sql as derived_schema_sql
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


_CREATE = re.compile(r"^CREATE (?:TABLE IF NOT EXISTS|OR REPLACE VIEW) (\w+)")
_COLUMN = re.compile(r"^\s+(\w+) [A-Z]")
_VIEW_COLUMN = re.compile(r"^-- @column (\w+): (.*)$")


def schema_comments(sql: str) -> list[tuple[str, str, str | None, str]]:
    """(kind, table, column, text) for every documented table, view and column of `sql`: the
    `-- ` lines right above a CREATE or a column definition, and a view's `-- @column name:
    text` lines after it. The schema files are the one place the columns are described; this
    copies that text into DuckDB's catalog, where DESCRIBE and duckdb_columns() show it."""
    out: list[tuple[str, str, str | None, str]] = []
    pending: list[str] = []
    table: str | None = None
    for line in sql.splitlines():
        stripped = line.strip()
        view_col = _VIEW_COLUMN.match(stripped)
        if view_col and table:
            out.append(("column", table, view_col.group(1), view_col.group(2)))
            continue
        if stripped.startswith("--"):
            pending.append(stripped[2:].strip())
            continue
        created = _CREATE.match(stripped)
        column = _COLUMN.match(line)
        if created:
            table = created.group(1)
            if pending:
                out.append(("table", table, None, " ".join(pending)))
        elif column and table and pending and column.group(1).upper() != "PRIMARY":
            out.append(("column", table, column.group(1), " ".join(pending)))
        pending = []
    return out


def apply_comments(con: duckdb.DuckDBPyConnection, sql: str, only: str | None = None) -> None:
    for kind, table, column, text in schema_comments(sql):
        if only is not None and table != only:
            continue
        quoted = "'" + text.replace("'", "''") + "'"
        if kind == "table":
            is_view = con.execute(
                "SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [table]
            ).fetchall()[0][0]
            con.execute(f"COMMENT ON {'VIEW' if is_view else 'TABLE'} {table} IS {quoted}")
        else:
            con.execute(f"COMMENT ON COLUMN {table}.{column} IS {quoted}")


def apply_view_comments(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Copy the comments of one table or view of the store's own schema files into DuckDB's
    catalog again (a replaced view loses them)."""
    sql = "\n".join(
        resources.files("tracelab").joinpath(f"store/schema/{f}").read_text() for f in SCHEMA_FILES
    )
    apply_comments(con, sql, only=name)


def rederive_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the derived tables and create them as this tracelab defines them (their rows are
    recomputed from the base tables by tracelab.derived; no event is touched)."""
    sql = derived_schema_sql()
    con.execute("BEGIN")
    try:
        made = [
            (m.group(1), "VIEW" in line)
            for line in sql.splitlines()
            if (m := _CREATE.match(line.strip()))
        ]
        for name, is_view in sorted(made, key=lambda x: not x[1]):  # views first
            con.execute(f"DROP {'VIEW' if is_view else 'TABLE'} IF EXISTS {name}")
        con.execute(sql)
        apply_comments(con, sql)
        con.execute(
            "INSERT OR REPLACE INTO tracelab_meta VALUES ('derived_version', ?)",
            [str(DERIVED_VERSION)],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


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
