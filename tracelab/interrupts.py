"""Ctrl-C and SIGTERM stop this process's DuckDB queries at once, whichever thread runs them.

Python runs a signal's handler in the main thread, and DuckDB lets it run (PyErr_CheckSignals)
only between the tasks of a query that the main thread executes. One task can be most of a
query, and on a loaded machine the main thread often runs it: on 2 busy cores, SIGINT 0.3 s
into `SELECT count(*) FROM range(4000000000) t(x) WHERE x % 7 = 3` was acted on after 24-28 s in
4 of 8 tries, and into a Parquet scan joined to a range after 4.3-4.8 s in 5 of 6; the CLI's
signal tests took 46-72 s instead of 1.5 s beside other jobs. A query run in a thread (the
lost-time parts' batches) was never interrupted: the signal waited for its end.

While `watching()`, Python's C-level handler also writes each signal's number to a pipe
(signal.set_wakeup_fd) that a thread reads: on SIGINT or SIGTERM it interrupts every
connection opened `interruptible()` (DuckDB's interrupt() may be called from any thread), whose
query raises InterruptException at once (tracelab.errors.raise_if_interrupted), and the
handler then runs in the main thread as before. 12 tries of the same two queries under the
same load: 0.30-0.32 s each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar


class _Interruptible(Protocol):
    def interrupt(self) -> None: ...


C = TypeVar("C", bound=_Interruptible)

_lock = threading.Lock()
_open: dict[int, _Interruptible] = {}
#: The signals that interrupt the queries.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interruptible(con: C) -> Iterator[C]:
    """`con` (a DuckDB connection) interrupted by SIGINT and SIGTERM while inside, where a
    command watches them (watching)."""
    with _lock:
        _open[id(con)] = con
    try:
        yield con
    finally:
        with _lock:
            _open.pop(id(con), None)


def interrupt_all() -> None:
    """Interrupt the query of every interruptible connection (a connection with none running
    is unaffected: DuckDB clears the mark when its next query starts)."""
    with _lock:
        cons = list(_open.values())
    for con in cons:
        with contextlib.suppress(Exception):  # closed meanwhile
            con.interrupt()


def _read(fd: int, signals: frozenset[int]) -> None:
    try:
        while data := os.read(fd, 512):
            if signals.intersection(data):
                interrupt_all()
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """SIGINT and SIGTERM interrupt the interruptible connections while inside (a no-op outside
    the main thread, where Python cannot take the signals). The signals need Python handlers
    (SIGINT has one unless the process was started with it ignored)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    reader = threading.Thread(
        target=_read,
        args=(read_fd, frozenset(int(s) for s in SIGNALS)),
        name="tracelab-interrupts",
        daemon=True,
    )
    reader.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the reader reads the end of the pipe and closes its side
