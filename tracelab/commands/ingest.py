"""`tracelab ingest PATH... [--db FILE] [--run NAME]`: traces or captures into the store."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tracelab.commands._common import add_db_option
from tracelab.errors import UsageError

if TYPE_CHECKING:
    from tracelab.ingest import IngestReport
    from tracelab.ingest.pool import Engine


def _rank_map(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        path, sep, rank = item.rpartition("=")
        if not sep or not path or not rank.strip().isdigit():
            raise UsageError(f"--rank takes FILE=N (e.g. --rank trace.json.gz=3), not {item!r}.")
        out[path] = int(rank)
    return out


def _print_report(report: IngestReport, db: str) -> None:
    ranks = report.ranks
    span = f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    of = f" of {report.world_size}" if report.world_size else ""
    if report.unchanged:
        print(f"run {report.run!r} is already in {db} from identical files: nothing to do.")
    else:
        print(
            f"ingested run {report.run!r} into {db}: {len(ranks)} "
            f"rank{'s' if len(ranks) != 1 else ''} ({span}){of}, {report.events:,} events"
        )
    for note in report.notes:
        print(f"note: {note}")
    for item in report.skipped:
        print(f"skipped {item['file']}: {item['error']}")
    if report.ignored:
        shown = ", ".join(report.ignored[:5]) + (", ..." if len(report.ignored) > 5 else "")
        print(f"ignored {len(report.ignored)} files that are not traces: {shown}")


def _mesh(text: str | None) -> dict[str, Any] | None:
    """`--mesh "dp_shard=2,tp=2"` as run metadata (tracelab.derived.groups.parse_mesh)."""
    if text is None:
        return None
    from tracelab.derived.groups import parse_mesh

    try:
        return parse_mesh(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _engine(args: argparse.Namespace) -> Engine | None:
    from tracelab.ingest.pool import Engine

    engine = getattr(args, "engine", "local")
    address = getattr(args, "address", None)
    if address and engine != "ray":
        raise UsageError("--address names a Ray cluster: add --engine ray.")
    return Engine(name="ray", address=address) if engine == "ray" else None


def ingest_paths(args: argparse.Namespace) -> list[IngestReport]:
    """Ingest the command line's paths: one run, or one run per capture when the paths are
    folders of capture folders (`tracelab ingest sample_traces`), each named after its folder."""
    from tracelab.ingest import ingest
    from tracelab.ingest.discover import capture_runs

    options = {
        "db": args.db,
        "ranks": _rank_map(args.rank),
        "if_exists": "replace" if args.replace else "refuse",
        "skip_bad": args.skip_bad,
        "workers": args.workers,
        "engine": _engine(args),
        "mesh": _mesh(getattr(args, "mesh", None)),
    }
    captures = capture_runs(args.paths)
    if captures is None:
        report = ingest(args.paths, run=args.run, **options)
        _print_report(report, args.db)
        return [report]
    if args.run:
        raise UsageError(
            f"--run names one run, but {' '.join(args.paths)} holds {len(captures)} capture "
            "folders. Drop --run to ingest each as a run named after its folder, or name one "
            f"capture: tracelab ingest {captures[0][1]} --run {args.run}."
        )
    print(f"{len(captures)} capture folders: one run each, named after its folder")
    reports = []
    for name, folder in captures:
        report = ingest([folder], run=name, **options)
        _print_report(report, args.db)
        reports.append(report)
    return reports


def run(args: argparse.Namespace) -> int:
    from tracelab.ingest.pool import pyarrow_without_pandas

    pyarrow_without_pandas()  # this process never needs pandas: 0.26 s of an ingest
    ingest_paths(args)
    return 0


def add_ingest_options(p: argparse.ArgumentParser) -> None:
    """The options of `tracelab ingest` (also taken by `tracelab open`)."""
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders")
    add_db_option(p)
    p.add_argument(
        "--run", metavar="NAME", help="run name (default: the folder's or manifest's name)"
    )
    p.add_argument(
        "--rank",
        action="append",
        default=[],
        metavar="FILE=N",
        help="map a trace without rank metadata to rank N (repeatable; FILE as given, its base "
        "name, or a tensorboard_trace_handler worker name such as host_1234)",
    )
    p.add_argument("--replace", action="store_true", help="replace a run of the same name")
    p.add_argument(
        "--mesh",
        metavar="DIMS",
        help='the job\'s device mesh, outermost dimension first, e.g. "dp_shard=2,tp=2" '
        "(init_device_mesh's order): names each process group's parallel dimension where "
        "the traces do not (stored in the run's metadata; docs/metrics.md)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="ingest the good ranks and record the bad files in the run instead of aborting",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="parallel parser processes (default: all cores)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="where files are converted: this machine's process pool (default), or Ray tasks "
        "that write each trace's Parquet files beside it (needs tracelab[ray] and a path every "
        "node sees; docs/scale-out.md)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="with --engine ray: the cluster to join (host:port of `ray start --head`); "
        "default: a local Ray instance for this ingest",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="ingest trace files, folders or a capture folder as one run",
        description="Ingest per-rank PyTorch profiler traces (.json/.json.gz, any number of "
        "ranks) or a tracelab capture folder into the store, as one run; a folder of capture "
        "folders as one run per capture. A lone trace without rank metadata is rank 0 of 1. "
        "All or nothing: a bad file leaves the store unchanged unless --skip-bad. Exit codes: "
        "0 ok, 2 usage, 3 input error.",
    )
    add_ingest_options(p)
    p.set_defaults(func=run)
