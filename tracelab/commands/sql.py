"""`tracelab sql "SELECT ..."`: read-only SQL over the store, printed as a table, CSV or JSON.

Read-only for real, so that a notebook, bot or wrapper may pass someone else's SQL: the store is
opened read-only, then external access is switched off (no file read or written, no ATTACH of
another file, no extension installed or loaded) and the configuration is locked, so the query
cannot switch it back. The text must be exactly one statement, a query (SELECT, FROM, WITH,
SHOW, DESCRIBE, SUMMARIZE, EXPLAIN); COPY, EXPORT, ATTACH, INSTALL, LOAD, SET, PRAGMA, CALL,
CHECKPOINT and every write are refused before anything runs. Exit 2 for a refused or failing
query.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from tracelab.commands._common import add_db_option
from tracelab.errors import UsageError
from tracelab.tables import print_table

#: Statement types a query may be (duckdb.StatementType names).
ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


def check_query(query: str) -> str:
    """The one read-only statement of `query`; UsageError naming what is refused otherwise."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise UsageError(f"the query does not parse: {exc}") from None
    if not statements:
        raise UsageError('no SQL statement given, e.g. tracelab sql "SELECT count(*) FROM events".')
    if len(statements) > 1:
        raise UsageError(
            f"give one statement, not {len(statements)}: tracelab sql runs a "
            "single read-only query."
        )
    kind = statements[0].type.name
    if kind not in ALLOWED_STATEMENTS:
        raise UsageError(
            f"{kind} statements are refused: tracelab sql is read-only and runs "
            "only queries (SELECT, WITH, FROM, SHOW, DESCRIBE, SUMMARIZE, EXPLAIN). "
            "To write Parquet, use `tracelab export`."
        )
    return query


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique as DuckDB's own results do (QueryResult::DeduplicateColumns):
    a repeated name gets `_1`, `_2`, ... (case-insensitively, skipping names already taken),
    so `SELECT r.name, e.name` prints `name` and `name_1`, never one value under two headers."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for name in names:
        low = name.lower()
        if low not in seen:
            seen[low] = 1
            out.append(name)
            continue
        new = f"{name}_{seen[low]}"
        while new.lower() in seen:
            seen[low] += 1
            new = f"{name}_{seen[low]}"
        seen[new.lower()] = 1
        out.append(new)
    return out


#: `DESCRIBE name`: the one statement `tracelab sql` answers with the schema's column comments
#: too (DuckDB's DESCRIBE does not show them).
_DESCRIBE = re.compile(
    r"^\s*DESCRIBE\s+(?:TABLE\s+)?\"?([A-Za-z_][A-Za-z0-9_]*)\"?\s*;?\s*$", re.IGNORECASE
)


def _with_comments(
    con: Any, query: str, cols: list[str], rows: list[tuple]
) -> tuple[list[str], list[tuple]]:
    """DESCRIBE's rows with a `comment` column: each column's definition from the schema
    files (docs/metrics.md for the derived tables)."""
    m = _DESCRIBE.match(query)
    if m is None or "column_name" not in cols:
        return cols, rows
    comments = dict(
        con.execute(
            "SELECT column_name, comment FROM duckdb_columns() WHERE table_name = ?", [m.group(1)]
        ).fetchall()
    )
    i = cols.index("column_name")
    return cols + ["comment"], [(*r, comments.get(r[i]) or "") for r in rows]


def run(args: argparse.Namespace) -> int:
    import duckdb

    from tracelab.store import open_store
    from tracelab.store.files import store_root
    from tracelab.store_folder import listed, unreadable_files

    query = check_query(args.query)
    if args.limit < 0:
        raise UsageError(f"--limit must be 0 (all rows) or more, not {args.limit}.")
    with open_store(args.db) as con:
        # The query reads the store and the store folder's files (the events view), no more.
        root = store_root(con)
        con.execute("SET allowed_directories = ?", [[str(root) + "/"] if root else []])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            cur = con.execute(query)
            if cur is None or cur.description is None:
                return 0
            cols = unique_names([d[0] for d in cur.description])
            rows = cur.fetchmany(args.limit + 1) if args.limit else cur.fetchall()
            cols, rows = _with_comments(con, query, cols, rows)
        except duckdb.Error as exc:
            if isinstance(exc, duckdb.IOException) and root is not None and str(root) in str(exc):
                # A file the catalog lists is gone or unreadable: the store, not the query.
                names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
                raise unreadable_files(root, listed(con), names, exc) from None
            raise UsageError(f"the query failed: {exc}") from None
    truncated = bool(args.limit) and len(rows) > args.limit
    rows = rows[: args.limit] if args.limit else rows
    print_table([dict(zip(cols, r, strict=True)) for r in rows], fmt=args.format, columns=cols)
    if truncated and args.format == "table":
        print(f"(first {args.limit} rows; --limit 0 prints all)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sql",
        help="run one read-only SQL query over the store",
        description="Run one SQL query over the store: opened read-only, with file access and "
        "extensions switched off and the settings locked (COPY, ATTACH, INSTALL, SET, PRAGMA "
        "and writes are refused). Tables: runs, ranks, events, steps, lanes, collectives, "
        "memory, baselines, and the derived tables (step_spans, step_parts, time_parts, matched_collectives, ...; DESCRIBE shows their column comments; see docs/metrics.md). Exit codes: 0 ok, 2 refused or failed query, "
        "3 unusable store.",
    )
    p.add_argument("query", help='e.g. "SELECT name, count(*) FROM events GROUP BY 1"')
    add_db_option(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--limit", type=int, default=1000, help="rows to print (0 = all)")
    p.set_defaults(func=run)
