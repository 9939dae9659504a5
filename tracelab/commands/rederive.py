"""`tracelab rederive`: recompute the derived tables of every run (or of the named ones)."""

from __future__ import annotations

import argparse
import sys

from tracelab.commands._common import add_db_option


def run(args: argparse.Namespace) -> int:
    from tracelab.derived import derive_in_transaction
    from tracelab.store import open_store, rederive_schema, resolve_run

    with open_store(args.db, read_only=False, stale_derived_ok=True) as con:
        rederive_schema(con)
        if args.run:
            ids = [resolve_run(con, name) for name in args.run]
        else:
            ids = [
                (int(r), str(n))
                for r, n in con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall()
            ]
        failed = 0
        for rid, name in ids:
            report = derive_in_transaction(con, rid)
            for comp, why in report.errors.items():
                print(
                    f"tracelab rederive: run {name!r}: {comp} could not be derived: {why}",
                    file=sys.stderr,
                )
            failed += bool(report.errors)
    print(
        f"rederived {len(ids)} run(s) in {args.db}"
        + (f"; {failed} with components that failed (see above)" if failed else ""),
        file=sys.stderr,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rederive",
        help="recompute the derived tables (after a tracelab upgrade)",
        description="Recompute every run's derived tables (steps, clock offsets, matched "
        "collectives, the lost-time parts; docs/metrics.md) from the events the "
        "store holds, keeping every event. Needed when a store was written by a "
        "tracelab whose definitions differ; each run is its own transaction.",
    )
    add_db_option(p)
    p.add_argument("--run", action="append", metavar="NAME", help="only this run (repeatable)")
    p.set_defaults(func=run)
