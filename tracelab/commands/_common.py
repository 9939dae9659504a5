"""Options shared by several subcommands."""

from __future__ import annotations

import argparse

from tracelab.defaults import DEFAULT_DB


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="FILE",
        help=f"DuckDB store file (default: ./{DEFAULT_DB})",
    )


def add_run_option(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--run",
        required=required,
        metavar="NAME",
        help="run name in the store (default: the newest run)",
    )
