"""`tracelab export --run NAME --out DIR`: a run as Parquet, events partitioned by rank;
`tracelab export --format perfetto --run NAME --out FILE.json`: one clock-aligned multi-rank
Chrome trace that Perfetto's UI opens (a process per rank)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from tracelab.store import open_store
    from tracelab.store.export import export_run

    if getattr(args, "format", "parquet") == "perfetto":
        return _perfetto(args)

    with open_store(args.db) as con:
        written = export_run(con, args.run, args.out, overwrite=args.overwrite)
    print(
        f"exported run to {args.out}: " + ", ".join(f"{t} ({n:,} rows)" for t, n in written.items())
    )
    return 0


def _perfetto(args: argparse.Namespace) -> int:
    from tracelab.store import open_store
    from tracelab.store.export import export_perfetto

    with open_store(args.db, read_only=True) as con:
        n = export_perfetto(con, args.run, args.out, overwrite=args.overwrite)
    print(
        f"wrote {args.out}: {n['events']:,} events and {n['time_parts']:,} lost-time segments, "
        "one process per rank on the aligned clock; open it at https://ui.perfetto.dev"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from tracelab.commands._common import add_db_option, add_run_option

    p = subparsers.add_parser(
        "export",
        help="write a run as Parquet (events partitioned by rank)",
        description="Write one run as Parquet files: events/rank=N/*.parquet (hive-partitioned, "
        "so DuckDB, Spark or Trino can query it in place) plus one file per other table of the "
        "run: the base tables (steps, ranks, collectives, memory, lanes, ...) and the derived "
        "ones (step_parts, time_parts, matched_collectives, ...; docs/metrics.md).",
    )
    add_db_option(p)
    add_run_option(p)
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder (parquet) or file (perfetto: .json, or .json.gz for gzip)",
    )
    p.add_argument(
        "--format",
        choices=("parquet", "perfetto"),
        default="parquet",
        help="parquet (default): tables as Parquet files; perfetto: one Chrome-trace "
        "JSON of every rank, clock offsets applied, for ui.perfetto.dev",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=run)
