"""The one exception tree of tracelab.

Every message says what happened, where (file, rank, event) and what to do next. The CLI maps
these classes to exit codes: usage errors exit 2, input errors exit 3.
"""

from __future__ import annotations

import traceback


class TracelabError(Exception):
    """Base class of every error tracelab raises on purpose."""

    exit_code = 1


class UsageError(TracelabError):
    """The command was called wrongly (unknown run, bad option value)."""

    exit_code = 2


class InputError(TracelabError):
    """An input file or capture is unusable. `path` names it when there is one."""

    exit_code = 3

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class TraceFormatError(InputError):
    """A trace file is truncated, corrupt, not JSON, or not a Kineto trace."""


class RankConflictError(InputError):
    """Ranks are missing from a trace or claimed twice."""


class StoreError(TracelabError):
    """The store cannot be used (other schema version, locked for too long, corrupt)."""

    exit_code = 3


class StoreLockedError(StoreError):
    """Another process held the store's lock for longer than we were willing to wait."""


class RunNotFoundError(UsageError):
    """A run name that is not in the store."""


class InternalError(TracelabError):
    """A bug in tracelab, met while handling one input file: the CLI prints one line naming the
    file and where to report it (TRACELAB_DEBUG=1 adds the traceback), and --skip-bad skips the
    file like a bad one."""

    exit_code = 70  # EX_SOFTWARE (sysexits.h): never 1, which `report` uses for a regression

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a signal that DuckDB turned into its own error: a Ctrl-C or SIGTERM
    during a query comes out as `InterruptException` (also from another thread's interrupt(),
    tracelab.interrupts) or as a RuntimeError "Query interrupted"."""
    return type(exc).__name__ == "InterruptException" or (
        isinstance(exc, RuntimeError) and "Query interrupted" in str(exc)
    )


def raise_if_interrupted(exc: BaseException) -> None:
    """Raise KeyboardInterrupt when `exc` is a signal that DuckDB turned into its own error
    (is_interrupt), which a component's failure policy (isolate it, name it, go on) would
    otherwise record as that component failing, and commit the run without it. The CLI exits
    130, or 143 after SIGTERM (tracelab.cli)."""
    if is_interrupt(exc):
        raise KeyboardInterrupt from exc


def failure_reason(exc: BaseException) -> str:
    """One line for a component that failed (an analyzer, a derived table): the exception, its
    first message line and where it was raised, at most 500 characters."""
    last = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}{where}"[:500]
