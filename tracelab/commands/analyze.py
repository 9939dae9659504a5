"""`tracelab analyze`: run every analyzer on one run; findings worst first, then the metrics."""

from __future__ import annotations

import argparse
import sys

from tracelab.commands._common import add_db_option, add_run_option
from tracelab.errors import InputError
from tracelab.render import formats


def run(args: argparse.Namespace) -> int:
    from tracelab.analyzers import analysis_document
    from tracelab.analyzers import run as run_analyzers
    from tracelab.render import renderer
    from tracelab.store import open_store, resolve_run

    render = renderer("analysis", args.format).render

    only = [a.strip() for a in args.only.split(",")] if args.only else None
    if args.prediction:  # read now: a missing or malformed file is an error (exit 3), not a note
        from tracelab.memory_model import load_config

        try:
            load_config(args.prediction)
        except ValueError as exc:
            why = str(exc).removeprefix(f"{args.prediction}: ")
            raise InputError(f"not a usable prediction config: {why}", args.prediction) from None
    with open_store(args.db) as con:
        rid, name = resolve_run(con, args.run)
        ranks = con.execute(
            "SELECT rank_count, world_size FROM runs WHERE run_id = ?", [rid]
        ).fetchall()[0]
        params = {"memory": {"prediction": args.prediction}} if args.prediction else None
        analysis = run_analyzers(con, rid, only=only, params=params)
    run_info = {
        "name": name,
        "run_id": rid,
        "ranks": ranks[0] if ranks else None,
        "world_size": ranks[1] if ranks else None,
    }
    sys.stdout.write(render(analysis_document(run_info, analysis)))
    for name_, why in analysis.errors.items():
        print(f"tracelab analyze: {name_} failed on this run: {why}", file=sys.stderr)
    return 3 if analysis.errors else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="diagnose a run: findings worst first, then metrics",
        description="Run every analyzer on one run of the store and print its findings, worst "
        "impact first, then each analyzer's metrics. --format json gives the "
        "stable document described in docs/json-schema.md.",
    )
    add_db_option(p)
    add_run_option(p)
    p.add_argument("--format", choices=formats("analysis"), default="text")
    p.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated analyzers to run (default: all): steps, breakdown, "
        "clocks, stragglers, pipeline, memory",
    )
    p.add_argument(
        "--prediction",
        metavar="CONFIG",
        help="a `tracelab estimate` config (YAML or JSON): the memory analyzer puts its "
        "per-stage prediction beside the run's estimate and measured peak",
    )
    p.set_defaults(func=run)
