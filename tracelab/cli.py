"""The `tracelab` console script: one entry point, one module per subcommand.

Each module in COMMANDS exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the default. Errors from tracelab.errors map to exit codes
(2 usage, 3 input); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tracelab import __version__
from tracelab.errors import TracelabError

#: Subcommand modules, in the order `tracelab --help` lists them.
COMMANDS = (
    "tracelab.commands.ingest",
    "tracelab.commands.convert",
    "tracelab.commands.runs",
    "tracelab.commands.sql",
    "tracelab.commands.rederive",
    "tracelab.commands.export",
    "tracelab.commands.analyze",
    "tracelab.commands.serve",
    "tracelab.commands.open",
    "tracelab.commands.report",
    "tracelab.commands.baseline",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracelab",
        description="Trace-driven profiling and diagnosis for distributed PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"tracelab {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # numpy's OpenBLAS starts a thread per core at import, which spin-waits for work; nothing
    # in tracelab does linear algebra, and in a profiled ingest on 2 cores that spinning took
    # 2% of the CPU. Set before any subcommand imports numpy; a user's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TracelabError as exc:
        print(f"tracelab {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
