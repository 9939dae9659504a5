"""`tracelab sql "SELECT ..."`: read-only SQL over the store, printed as a table, CSV or JSON."""

from __future__ import annotations

import argparse

from tracelab.commands._common import add_db_option
from tracelab.errors import UsageError
from tracelab.tables import print_table


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


def run(args: argparse.Namespace) -> int:
    import duckdb

    from tracelab.store import open_store

    with open_store(args.db) as con:
        try:
            cur = con.execute(args.query)
        except duckdb.Error as exc:
            raise UsageError(f"the query failed: {exc}") from exc
        if cur.description is None:
            return 0
        cols = unique_names([d[0] for d in cur.description])
        rows = cur.fetchmany(args.limit + 1) if args.limit else cur.fetchall()
    truncated = bool(args.limit) and len(rows) > args.limit
    rows = rows[: args.limit] if args.limit else rows
    print_table([dict(zip(cols, r, strict=True)) for r in rows], fmt=args.format, columns=cols)
    if truncated and args.format == "table":
        print(f"(first {args.limit} rows; --limit 0 prints all)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sql", help="run read-only SQL over the store",
        description="Run a SQL query over the store (opened read-only). Tables: runs, ranks, "
        "events, steps, lanes, collectives, memory, baselines; see tracelab/schema/v1.sql.",
    )
    p.add_argument("query", help='e.g. "SELECT name, count(*) FROM events GROUP BY 1"')
    add_db_option(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--limit", type=int, default=1000, help="rows to print (0 = all)")
    p.set_defaults(func=run)
