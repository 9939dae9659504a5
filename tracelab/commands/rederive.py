"""`tracelab rederive`: recompute the derived tables of every run (or of the named ones).

The derived tables are dropped and made again (this tracelab's definitions) only when every
run is rederived: without --run, or when the store's derived tables are of another tracelab
version, whose rows no run can keep. `--run` on a current store rederives the named runs alone,
leaving the others' rows as they are (it used to drop every run's derived rows first)."""

from __future__ import annotations

import argparse
import sys

from tracelab.commands._common import add_db_option


def run(args: argparse.Namespace) -> int:
    from tracelab.derived import derive_in_transaction
    from tracelab.store import (
        DERIVED_VERSION,
        mark_derived_current,
        open_store,
        rederive_schema,
        resolve_run,
        stored_derived_version,
    )
    from tracelab.store.files import check_files_present

    with open_store(args.db, read_only=False, stale_derived_ok=True, create=False) as con:
        named = [resolve_run(con, name) for name in args.run or []]
        check_files_present(con)
        stale = stored_derived_version(con) != DERIVED_VERSION
        every = stale or not named
        if every:
            rederive_schema(con)
        if named and stale:
            print(
                "tracelab rederive: the store's derived tables are not all this tracelab's "
                "(another version's, or a rederive that stopped): every run is rederived, not "
                "only the runs named",
                file=sys.stderr,
            )
        if not every:
            ids = named
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
        if every:
            mark_derived_current(con)  # every run is recomputed: the store opens again
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
