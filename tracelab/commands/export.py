"""`tracelab export --run NAME --out DIR`: a run as Parquet, events partitioned by rank."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from tracelab.export import export_run
    from tracelab.store import open_store

    with open_store(args.db) as con:
        written = export_run(con, args.run, args.out, overwrite=args.overwrite)
    print(f"exported run to {args.out}: " + ", ".join(f"{t} ({n:,} rows)" for t, n in written.items()))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from tracelab.commands._common import add_db_option, add_run_option

    p = subparsers.add_parser(
        "export", help="write a run as Parquet (events partitioned by rank)",
        description="Write one run as Parquet files: events/rank=N/*.parquet (hive-partitioned, "
        "so DuckDB, Spark or Trino can query it in place) plus one file per other table.",
    )
    add_db_option(p)
    add_run_option(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=run)
