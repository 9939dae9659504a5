"""`tracelab runs`: the runs in the store."""

from __future__ import annotations

import argparse

from tracelab.commands._common import add_db_option
from tracelab.tables import print_table


def run(args: argparse.Namespace) -> int:
    from tracelab.store import list_runs, open_store

    with open_store(args.db) as con:
        runs = list_runs(con)
    rows = [
        {
            "name": r["name"],
            "ranks": f"{r['ranks']}/{r['world_size']}" if r["world_size"] else r["ranks"],
            "steps": r["steps"],
            "span_s": f"{float(r['span_ns']) / 1e9:.3f}" if r["span_ns"] is not None else "",  # type: ignore[arg-type]
            "skipped_files": r["skipped"],
            "created": str(r["created_at"])[:19],
        }
        for r in runs
    ]
    print_table(rows, fmt=args.format)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "runs",
        help="list the runs in the store",
        description="List the runs in the store, newest first.",
    )
    add_db_option(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=run)
