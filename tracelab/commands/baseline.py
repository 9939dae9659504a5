"""`tracelab baseline`: pin a run as a named baseline that later reports compare against."""

from __future__ import annotations

import argparse
import datetime as dt

from tracelab.commands._common import add_db_option
from tracelab.errors import UsageError


def save(args: argparse.Namespace) -> int:
    from tracelab.store import open_store, resolve_run

    with open_store(args.db, read_only=False, create=False) as con:
        _, run_name = resolve_run(con, args.run)
        old = con.execute("SELECT run_name FROM baselines WHERE name = ?", [args.name]).fetchone()
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        con.execute("INSERT OR REPLACE INTO baselines VALUES (?, ?, ?)", [args.name, run_name, now])
    moved = f" (was {old[0]!r})" if old and old[0] != run_name else ""
    print(f"baseline {args.name!r} -> run {run_name!r}{moved}")
    return 0


def list_(args: argparse.Namespace) -> int:
    from tracelab.store import open_store
    from tracelab.tables import print_table

    with open_store(args.db) as con:
        rows = con.execute(
            "SELECT b.name, b.run_name, b.saved_at, r.run_id IS NOT NULL FROM baselines b "
            "LEFT JOIN runs r ON r.name = b.run_name ORDER BY b.name"
        ).fetchall()
    print_table(
        [
            {"name": n, "run": r, "saved": str(s)[:19], "run_present": bool(p)}
            for n, r, s, p in rows
        ],
        fmt=args.format,
    )
    return 0


def delete(args: argparse.Namespace) -> int:
    from tracelab.store import open_store

    with open_store(args.db, read_only=False, create=False) as con:
        row = con.execute("SELECT run_name FROM baselines WHERE name = ?", [args.name]).fetchone()
        if row is None:
            names = [r[0] for r in con.execute("SELECT name FROM baselines").fetchall()]
            raise UsageError(
                f"no baseline named {args.name!r}. Baselines: {', '.join(names) or 'none'}."
            )
        con.execute("DELETE FROM baselines WHERE name = ?", [args.name])
    print(f"deleted baseline {args.name!r} (it pinned run {row[0]!r}; the run is kept)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "baseline",
        help="pin a run as a named baseline for reports",
        description="Named baselines for `tracelab report --baseline NAME`.",
    )
    sub = p.add_subparsers(dest="baseline_command", metavar="ACTION", required=True)
    s = sub.add_parser(
        "save",
        help="pin a run (default: the newest) as baseline NAME",
        description="Pin a run as baseline NAME, replacing an earlier pin.",
    )
    s.add_argument("name", metavar="NAME")
    s.add_argument("--run", metavar="RUN", help="run name in the store (default: the newest run)")
    add_db_option(s)
    s.set_defaults(func=save)
    ls = sub.add_parser("list", help="list the named baselines")
    add_db_option(ls)
    ls.add_argument("--format", choices=("table", "csv", "json"), default="table")
    ls.set_defaults(func=list_)
    d = sub.add_parser("delete", help="delete baseline NAME (the run stays)")
    d.add_argument("name", metavar="NAME")
    add_db_option(d)
    d.set_defaults(func=delete)
