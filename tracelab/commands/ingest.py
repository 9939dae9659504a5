"""`tracelab ingest PATH... [--db FILE] [--run NAME]`: traces or captures into the store."""

from __future__ import annotations

import argparse

from tracelab.commands._common import add_db_option
from tracelab.errors import UsageError


def _rank_map(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        path, sep, rank = item.rpartition("=")
        if not sep or not path or not rank.strip().isdigit():
            raise UsageError(f"--rank takes FILE=N (e.g. --rank trace.json.gz=3), not {item!r}.")
        out[path] = int(rank)
    return out


def run(args: argparse.Namespace) -> int:
    from tracelab.ingest import ingest

    report = ingest(
        args.paths,
        db=args.db,
        run=args.run,
        ranks=_rank_map(args.rank),
        if_exists="replace" if args.replace else "refuse",
        skip_bad=args.skip_bad,
        workers=args.workers,
    )
    ranks = report.ranks
    span = f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    of = f" of {report.world_size}" if report.world_size else ""
    if report.unchanged:
        print(f"run {report.run!r} is already in {args.db} from identical files: nothing to do.")
    else:
        print(
            f"ingested run {report.run!r} into {args.db}: {len(ranks)} ranks ({span}){of}, "
            f"{report.events:,} events"
        )
    for item in report.skipped:
        print(f"skipped {item['file']}: {item['error']}")
    if report.ignored:
        shown = ", ".join(report.ignored[:5]) + (", ..." if len(report.ignored) > 5 else "")
        print(f"ignored {len(report.ignored)} files that are not traces: {shown}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="ingest trace files, folders or a capture folder as one run",
        description="Ingest per-rank PyTorch profiler traces (.json/.json.gz, any number of "
        "ranks) or a tracelab capture folder into the store, as one run. All or nothing: "
        "a bad file leaves the store unchanged unless --skip-bad. Exit codes: 0 ok, "
        "2 usage, 3 input error.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders")
    add_db_option(p)
    p.add_argument("--run", metavar="NAME", help="run name (default: the folder's or manifest's name)")
    p.add_argument(
        "--rank", action="append", default=[], metavar="FILE=N",
        help="map a trace without rank metadata to rank N (repeatable; FILE as given or its base name)",
    )
    p.add_argument("--replace", action="store_true", help="replace a run of the same name")
    p.add_argument(
        "--skip-bad", action="store_true",
        help="ingest the good ranks and record the bad files in the run instead of aborting",
    )
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel parser processes (default: all cores)")
    p.set_defaults(func=run)
