"""The `tracelab` console script: one entry point, one module per subcommand.

Each module in COMMANDS exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the default. Errors from tracelab.errors map to exit codes (2 usage,
3 input). No traceback reaches a user: anything else is a bug, printed as one line that names
the command, the file when known and where to report it, exit 70 (TRACELAB_DEBUG=1 prints the
traceback). A closed pipe (`tracelab analyze | head`) ends the command quietly; SIGTERM unwinds
like Ctrl-C, so that an ingest removes its staging folder and stops its workers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn, TextIO

from tracelab import __version__, interrupts
from tracelab.errors import InternalError, TracelabError, is_interrupt
from tracelab.ingest.validate import run_name, strip_control

#: Subcommand modules, in the order `tracelab --help` lists them.
COMMANDS = (
    "tracelab.commands.ingest",
    "tracelab.commands.convert",
    "tracelab.commands.runs",
    "tracelab.commands.delete",
    "tracelab.commands.sql",
    "tracelab.commands.rederive",
    "tracelab.commands.migrate",
    "tracelab.commands.export",
    "tracelab.commands.analyze",
    "tracelab.commands.serve",
    "tracelab.commands.open",
    "tracelab.commands.report",
    "tracelab.commands.baseline",
    "tracelab.commands.estimate",
    "tracelab.commands.hang",
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


#: Where an internal error asks to be reported.
REPORT_TO = "the tracelab issue tracker"
#: Exit code of an internal error (sysexits.h EX_SOFTWARE; 1 is the report's "regression").
INTERNAL_ERROR_EXIT = InternalError.exit_code
#: Options that name runs or baselines: checked as names before any command runs.
_NAME_OPTIONS = ("run", "baseline", "candidate", "name")


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that `finally` blocks run (like KeyboardInterrupt)."""


#: Set once SIGTERM arrived: DuckDB turns a signal during a query into its own
#: InterruptException (and later statements into "transaction is aborted"), which then means
#: "terminated", not a bug.
_terminated = False


#: Set once SIGINT arrived (a command whose query DuckDB interrupted may fail with another
#: error on the way out: a statement of the aborted transaction).
_interrupted = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _terminated
    _terminated = True
    interrupts.handled()
    raise Terminated()


def _on_sigint(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = True
    interrupts.handled()
    raise KeyboardInterrupt


def _import_native_held() -> None:
    """Import DuckDB with SIGTERM and SIGINT held, then deliver them: a SIGTERM during its
    native initialisation was raised inside it, where nanobind prints "Critical nanobind error
    ... Traceback" (a full run's kill test, SIGTERM at 10% of an ingest)."""
    with interrupts.signals_held():
        import duckdb  # noqa: F401


def _on_unraisable(unraisable: Any) -> None:
    """sys.unraisablehook while a command runs. A SIGTERM whose Terminated was raised where
    Python cannot raise (logging's at-fork hook as the ingest's pool forks, a `__del__`) was
    swallowed, printed as "Exception ignored ... Traceback", and the command went on. The
    signal is sent again from another thread a moment later (sent from here, its handler ran
    at once, inside this hook, and was swallowed again), to be raised where the command's own
    code runs; one that lands in such a place again comes back here."""
    if isinstance(unraisable.exc_value, Terminated):
        import threading

        again = threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGTERM))
        again.daemon = True
        again.start()
        return
    sys.__unraisablehook__(unraisable)


class _TerminalText:
    """A text stream to a terminal that drops escape sequences and control characters."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(strip_control(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _safe_terminal() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    for attr in ("stdout", "stderr"):
        stream = getattr(sys, attr)
        with contextlib.suppress(Exception):
            if stream.isatty():
                setattr(sys, attr, _TerminalText(stream))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _check_names(args: argparse.Namespace) -> None:
    for option in _NAME_OPTIONS:
        value = getattr(args, option, None)
        if isinstance(value, str) and not os.path.exists(value):
            run_name(value, option=f"--{option}")


def _quiet_broken_pipe() -> None:
    """The reader went away: send the rest of stdout nowhere, so that flushing at exit cannot
    raise again (Python's documented recipe)."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _internal_error(command: str, exc: BaseException) -> int:
    where = getattr(exc, "path", None) or getattr(exc, "filename", None)
    cause = exc.__cause__ if isinstance(exc, InternalError) and exc.__cause__ else exc
    what = f"{type(cause).__name__}: {cause}".strip().replace("\n", " ")
    if len(what) > 300:
        what = what[:297] + "..."
    if os.environ.get("TRACELAB_DEBUG") == "1":
        traceback.print_exception(exc)
    file = f" while reading {where}" if where and str(where) not in what else ""
    print(
        f"tracelab {command}: internal error{file}: {what}. This is a bug in tracelab: "
        f"please report it to {REPORT_TO} with this line and the command "
        "(TRACELAB_DEBUG=1 shows the traceback).",
        file=sys.stderr,
    )
    return INTERNAL_ERROR_EXIT


def _store_error(command: str, exc: BaseException) -> int | None:
    """DuckDB's own errors that mean a damaged store or a full disk, not a bug: exit 3."""
    if not type(exc).__module__.startswith(("duckdb", "_duckdb")):
        return None
    text = str(exc).replace("\n", " ")
    if "no space left" in text.lower():
        print(
            f"tracelab {command}: error: the disk is full ({type(exc).__name__}: {text[:300]}). "
            "Free space and run it again: the store keeps what its last commit wrote (an "
            "ingest needs room for its run twice until it ends: docs/store.md).",
            file=sys.stderr,
        )
        return 3
    if not any(
        w in text.lower()
        for w in ("corrupt", "checksum", "no space", "i/o error", "serialization", "failed to read")
    ):
        return None
    print(
        f"tracelab {command}: error: the store cannot be read ({type(exc).__name__}: "
        f"{text[:300]}). It may be damaged: re-ingest into a new --db.",
        file=sys.stderr,
    )
    return 3


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
    command = args.command
    global _terminated, _interrupted
    _terminated = _interrupted = False  # (tests call main() again in one process)
    previous = signal.getsignal(signal.SIGTERM)
    previous_int = signal.getsignal(signal.SIGINT)
    previous_hook = sys.unraisablehook
    with contextlib.suppress(ValueError):  # not the main thread (tests calling main)
        signal.signal(signal.SIGTERM, _on_sigterm)
        if previous_int is signal.default_int_handler:  # (not where it was ignored: nohup)
            signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = _on_unraisable
    try:
        with _safe_terminal():
            try:
                _check_names(args)
                _import_native_held()
                with interrupts.watching():  # a signal stops the queries of every thread
                    return int(args.func(args) or 0)
            except InternalError as exc:
                return _internal_error(command, exc)
            except TracelabError as exc:
                print(f"tracelab {command}: error: {exc}", file=sys.stderr)
                return exc.exit_code
            except KeyboardInterrupt:
                if _terminated:  # SIGTERM during a query, re-raised as an interrupt
                    print("terminated", file=sys.stderr)
                    return 143
                print("interrupted", file=sys.stderr)
                return 130
            except Terminated:
                print("terminated", file=sys.stderr)
                return 143
            except BrokenPipeError:
                _quiet_broken_pipe()
                return 0
            except Exception as exc:  # no traceback for users: see the module docstring
                if _terminated:
                    print("terminated", file=sys.stderr)
                    return 143
                if _interrupted or is_interrupt(exc):  # Ctrl-C inside DuckDB, or on the way out
                    print("interrupted", file=sys.stderr)
                    return 130
                code = _store_error(command, exc)
                return code if code is not None else _internal_error(command, exc)
    except Terminated:  # the handler ran late, while another exception was being handled
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being reported
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = previous_hook
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)
            if signal.getsignal(signal.SIGINT) is _on_sigint:
                signal.signal(signal.SIGINT, previous_int)


def run() -> NoReturn:
    """The `tracelab` command: main(), then the exit. Where the command started a Ray driver
    (tracelab.ingest.ray_engine), Ray's core leaves threads running past ray.shutdown(), and
    the interpreter's teardown crashed in one of them (SIGSEGV in the core worker's metrics,
    after "terminated": 5 in about 30 SIGTERMs of an ingest on Ray); where the reader of the
    signals still runs (interrupts.reader_running), the teardown could unwind it through
    DuckDB's C++ and abort (exit -6 after "interrupted"). Everything the command does is done
    by then, so it ends at once, with its exit status."""
    try:
        code = main()
    except SystemExit as exc:  # (Ray's own SIGTERM handler, where the CLI's was not back yet)
        code = exc.code if isinstance(exc.code, int) else 1
    engine = sys.modules.get("tracelab.ingest.ray_engine")
    if (engine is not None and getattr(engine, "started", False)) or interrupts.reader_running():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
