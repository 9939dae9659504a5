"""`tracelab delete RUN`: remove one run, every row of it, from the store."""

from __future__ import annotations

import argparse

from tracelab.commands._common import add_db_option


def run(args: argparse.Namespace) -> int:
    from tracelab.ingest.validate import run_name
    from tracelab.store import delete_run, open_store, run_id
    from tracelab.store.open import rollback

    name = run_name(args.name, option="RUN")
    with open_store(args.db, read_only=False, create=False) as con:
        rid = run_id(con, name)
        con.execute("BEGIN TRANSACTION")
        try:
            delete_run(con, rid)
            pinned = [
                r[0]
                for r in con.execute(
                    "SELECT name FROM baselines WHERE run_name = ? ORDER BY name", [name]
                ).fetchall()
            ]
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
    print(f"deleted run {name!r} from {args.db}")
    if pinned:
        print(
            f"baselines pinned to it now point at nothing: {', '.join(pinned)} "
            "(tracelab baseline save NAME --run OTHER re-pins one)"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "delete",
        help="delete a run from the store",
        description="Delete one run, with all its ranks, events, steps, collectives and "
        "memory rows, in one transaction. Exit codes: 0 ok, 2 no such run, 3 unusable store.",
    )
    p.add_argument("name", metavar="RUN", help="name of the run (see `tracelab runs`)")
    add_db_option(p)
    p.set_defaults(func=run)
