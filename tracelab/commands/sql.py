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
        raise UsageError(f"give one statement, not {len(statements)}: tracelab sql runs a "
                         "single read-only query.")
    kind = statements[0].type.name
    if kind not in ALLOWED_STATEMENTS:
        raise UsageError(f"{kind} statements are refused: tracelab sql is read-only and runs "
                         "only queries (SELECT, WITH, FROM, SHOW, DESCRIBE, SUMMARIZE, EXPLAIN). "
                         "To write Parquet, use `tracelab export`.")
    return query


def run(args: argparse.Namespace) -> int:
    import duckdb

    from tracelab.store import open_store

    query = check_query(args.query)
    if args.limit < 0:
        raise UsageError(f"--limit must be 0 (all rows) or more, not {args.limit}.")
    with open_store(args.db) as con:
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            cur = con.execute(query)
            if cur is None or cur.description is None:
                return 0
            cols = [d[0] for d in cur.description]
            rows = cur.fetchmany(args.limit + 1) if args.limit else cur.fetchall()
        except duckdb.Error as exc:
            raise UsageError(f"the query failed: {exc}") from None
    truncated = bool(args.limit) and len(rows) > args.limit
    rows = rows[: args.limit] if args.limit else rows
    print_table([dict(zip(cols, r, strict=True)) for r in rows], fmt=args.format, columns=cols)
    if truncated and args.format == "table":
        print(f"(first {args.limit} rows; --limit 0 prints all)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sql", help="run one read-only SQL query over the store",
        description="Run one SQL query over the store: opened read-only, with file access and "
        "extensions switched off and the settings locked (COPY, ATTACH, INSTALL, SET, PRAGMA "
        "and writes are refused). Tables: runs, ranks, events, steps, lanes, collectives, "
        "memory, baselines; see tracelab/schema/. Exit codes: 0 ok, 2 refused or failed query, "
        "3 unusable store.",
    )
    p.add_argument("query", help='e.g. "SELECT name, count(*) FROM events GROUP BY 1"')
    add_db_option(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--limit", type=int, default=1000, help="rows to print (0 = all)")
    p.set_defaults(func=run)
