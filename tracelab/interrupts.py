"""Ctrl-C and SIGTERM stop the DuckDB queries of a command's other threads too.

Python runs a signal's handler in the main thread, whose exception then unwinds the command;
a DuckDB query in another thread (the lost-time parts are derived in two: part_batches) never
saw the signal, and the command waited for that query's end before it could exit (a query of
10^11 rows: the test's subprocess timed out after 60 s). While `watching()`, Python's C-level
handler also writes each signal's number to a pipe (signal.set_wakeup_fd) that a thread reads;
once the main thread's handler has run (`handled()`), that thread interrupts every connection
opened `interruptible()` in another thread, and again every 50 ms while any is open (a thread
between two queries when the signal came has its next one interrupted; DuckDB forgets an
interrupt that finds no query). DuckDB's interrupt() may be called from any thread; the query
raises InterruptException in its own thread (tracelab.errors.is_interrupt), and the command
waits for its threads to end (part_batches) before it removes its staging folder.

The main thread's own queries are left to Python and DuckDB: the handler runs where DuckDB
checks for signals, between the tasks of a query that the main thread executes. A task can be
most of a query: on 2 busy cores, SIGINT 0.3 s into `SELECT count(*) FROM range(4000000000)
t(x) WHERE x % 7 = 3` was acted on after 24-28 s in 4 of 8 tries, into a Parquet scan joined to
a range after 4.3-4.8 s in 5 of 6. Interrupting that query too stopped it in 0.30-0.32 s, but
its InterruptException then reached the command's code before the handler had run, and the
handler raised later, inside the cleanup on the way out: a review's ingest left its staging
folder and a running batch thread behind in 4 of 8 SIGTERM tries. So the main thread waits.

signals_held() holds the two signals over work that a raise would leave halfway.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from typing import Protocol, TypeVar


class _Interruptible(Protocol):
    def interrupt(self) -> None: ...


C = TypeVar("C", bound=_Interruptible)

#: The signals that stop a command.
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How often the queries of other threads are interrupted once a signal was handled.
AGAIN_S = 0.05
#: The longest a command's end waits for the thread that reads the signals.
JOIN_S = 1.0

_lock = threading.Lock()
#: id(connection) -> (connection, the thread that opened it).
_open: dict[int, tuple[_Interruptible, int]] = {}
_handled = threading.Event()
#: The last watching()'s reader of the signals.
_reader: threading.Thread | None = None


def reader_running() -> bool:
    """Whether the last watching()'s reader is still running past its command's end (its wait,
    JOIN_S, ran out: a loaded machine, or another thread's query still open). The interpreter's
    exit would unwind it through DuckDB's C++ if it were inside interrupt() then, and abort the
    process: the `tracelab` command then ends without that exit (tracelab.cli.run)."""
    return _reader is not None and _reader.is_alive()


@contextlib.contextmanager
def interruptible(con: C) -> Iterator[C]:
    """`con` (a DuckDB connection, used by the thread that opens it) interrupted once a signal
    stops the command, where the command watches them (watching) and `con` is not the main
    thread's."""
    with _lock:
        _open[id(con)] = (con, threading.get_ident())
    try:
        yield con
    finally:
        with _lock:
            _open.pop(id(con), None)


def handled() -> None:
    """Called by the main thread's SIGINT and SIGTERM handlers (tracelab.cli): the command is
    unwinding, and the other threads' queries can be stopped."""
    _handled.set()


def _interrupt_other_threads(main: int) -> None:
    with _lock:
        cons = [con for con, thread in _open.values() if thread != main]
    for con in cons:
        with contextlib.suppress(Exception):  # closed meanwhile
            con.interrupt()


def _other_threads_open(main: int) -> bool:
    with _lock:
        return any(thread != main for _, thread in _open.values())


def _ended(fd: int, timeout_s: float) -> bool:
    """Whether the pipe's write end was closed (the command ended), waiting up to timeout_s."""
    ready, _, _ = select.select([fd], [], [], timeout_s)
    return bool(ready) and not os.read(fd, 512)


def _read(fd: int, signals: frozenset[int], main: int) -> None:
    try:
        while not signals.intersection(data := os.read(fd, 512)):
            if not data:
                return
        while not _handled.is_set():  # the main thread unwinds first
            if _ended(fd, AGAIN_S):
                return
        ended = False
        while True:  # also once the command ended, while another thread's query is open
            _interrupt_other_threads(main)
            if ended and not _other_threads_open(main):
                return
            if ended:
                time.sleep(AGAIN_S)
            else:
                ended = _ended(fd, AGAIN_S)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while inside, then delivered (where the system has signal
    masks): their handlers raise, and a raise in the midst of some work leaves it halfway (the
    staging folder's removal, DuckDB's native import: tracelab.cli)."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this system
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """SIGINT and SIGTERM stop the interruptible connections of other threads while inside,
    once the main thread's handler has run (a no-op outside the main thread, where Python
    takes no signal)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    global _reader
    _handled.clear()
    reader = _reader = threading.Thread(
        target=_read,
        args=(read_fd, frozenset(int(s) for s in SIGNALS), threading.get_ident()),
        name="tracelab-interrupts",
        daemon=True,
    )
    reader.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the reader sees the end of the pipe and closes its side
        # Its end, awaited (bounded: it goes on while another thread's query is open): a
        # daemon thread still inside DuckDB's interrupt() when the interpreter exits is unwound
        # through DuckDB's C++ ("FATAL: exception not rethrown", exit -6: a kill test after
        # "interrupted", once, on a loaded machine, and again with this wait, beside two other
        # test runs: reader_running).
        reader.join(JOIN_S)
