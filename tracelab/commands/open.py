"""`tracelab open TRACE_OR_FOLDER...`: from traces to the dashboard in one command.

It ingests into the store (the default ./tracelab.duckdb unless --db), analyzes the run, serves
the web app on 127.0.0.1 (this machine only, as `tracelab serve` does by default) and prints the
URL of the run's Overview. A folder of capture folders opens as one run per capture.
"""

from __future__ import annotations

import argparse

from tracelab.commands.ingest import add_ingest_options, ingest_paths
from tracelab.commands.serve import DEFAULT_HOST, DEFAULT_PORT, PORT_ENV, default_port, serve


def run(args: argparse.Namespace) -> int:
    port = (
        args.port if args.port is not None else default_port()
    )  # before the ingest: a bad setting fails first
    reports = ingest_paths(args)
    return serve(args.db, DEFAULT_HOST, port, runs=[r.run for r in reports])


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "open",
        help="ingest traces, analyze them and open the web app on the run",
        description="Ingest trace files, folders or capture folders into the store (as "
        "`tracelab ingest` does), analyze the run, serve the web app on 127.0.0.1 and print the "
        "URL of the run's Overview. Ctrl-C stops the server; the store keeps the run.",
    )
    add_ingest_options(p)
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}, or ${PORT_ENV} when set)",
    )
    p.set_defaults(func=run)
