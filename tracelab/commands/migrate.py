"""`tracelab migrate`: bring a store of an older schema version to this tracelab's, in place."""

from __future__ import annotations

import argparse
import sys

from tracelab.commands._common import add_db_option


def run(args: argparse.Namespace) -> int:
    from tracelab.commands import rederive
    from tracelab.store import open_store
    from tracelab.store.files import parquet_root
    from tracelab.store.migrate import migrate_store
    from tracelab.store.versions import DERIVED_VERSION, SCHEMA_VERSION, stored_derived_version

    done = migrate_store(args.db)
    if done.from_version == SCHEMA_VERSION:
        print(f"{args.db} is already at schema version {SCHEMA_VERSION}: nothing to do")
        return 0
    changes = []
    if done.from_version < 4:
        changes.append(f"{done.events} events moved into {done.files} Parquet files")
    changes.append(
        f"{done.memory_instants} trace memory instants into {done.memory_files} Parquet files"
    )
    if done.from_version <= 4:
        changes.append("collectives gained the all-to-all's per-peer bytes")
    moved = "; ".join(changes) + f" (the files under {parquet_root(args.db)})"
    print(
        f"migrated {args.db} from schema version {done.from_version} to {SCHEMA_VERSION}: {moved}",
        file=sys.stderr,
    )
    # An older store's derived tables were computed by an older tracelab: recompute them now,
    # so that the store opens (each run in its own transaction, as `tracelab rederive`).
    with open_store(args.db, stale_derived_ok=True) as con:
        stale = stored_derived_version(con) != DERIVED_VERSION
    if stale:
        return rederive.run(argparse.Namespace(db=args.db, run=None))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "migrate",
        help="migrate a store to this tracelab's schema version",
        description="Migrate a store of schema version 2 to 6 to version 7 (events and the "
        "trace's memory instants as Parquet files in STORE.parquet/ beside it, listed by the "
        "store; collectives with the all-to-all's per-peer bytes; process-group "
        "configurations once per run), "
        "keeping every run, in place, then recomputes derived tables an older tracelab computed. Killed before it commits, the store stays as it was. "
        "Exit codes: 0 ok (or nothing to do), 3 unusable store.",
    )
    add_db_option(p)
    p.set_defaults(func=run)
