"""Opening the DuckDB store safely: short connections, retried on a lock conflict.

DuckDB admits one read-write process or many read-only processes per file, never both, and a
second opener fails at once rather than waiting (DuckDB "Concurrency" documentation). tracelab therefore keeps
every connection short: the ingest parses and converts traces, and builds its run in a staged
store (tracelab.store.staged), without the store's lock, and holds the write lock only to take
the run's id and for the move; readers (the CLI, the dashboard) open the
store per request. Both sides retry on a lock conflict with a bounded back-off, so a dashboard
keeps serving while an ingest runs next to it.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

from tracelab.connections import connect
from tracelab.defaults import DEFAULT_DB, env_seconds
from tracelab.derived.sqlfiles import rollback as rollback  # re-exported for the store's writers
from tracelab.errors import StoreError, StoreLockedError
from tracelab.interrupts import interruptible
from tracelab.store.files import follow_moved_store, sweep
from tracelab.store.schema import ensure_schema
from tracelab.store.versions import (
    check_duckdb_storage,
    check_version,
    unopenable_store_error,
)
from tracelab.store_folder import check_owner

#: DuckDB's buffer memory for a writer. DuckDB keeps written blocks cached up to its limit (80%
#: of RAM by default), which would make an ingest's RSS grow with the run's size.
WRITER_MEMORY_LIMIT = os.environ.get("TRACELAB_WRITER_MEMORY_LIMIT", "1GB")
#: How long an opener waits for another process to release the file, in seconds
#: (TRACELAB_LOCK_TIMEOUT_S overrides it, read at each open).
DEFAULT_LOCK_TIMEOUT_S = 60.0


def _is_lock_conflict(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


def connect_with_retry(path: str, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            return connect(path, read_only=read_only)
        except duckdb.IOException as exc:
            if not _is_lock_conflict(exc):
                raise unopenable_store_error(path, exc) from exc
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{path}: another process has held the store for over {timeout_s:.0f} s "
                    f"({exc}). Wait for it to finish, or raise TRACELAB_LOCK_TIMEOUT_S."
                ) from exc
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


@contextlib.contextmanager
def open_store(
    path: str | os.PathLike[str] = DEFAULT_DB,
    *,
    read_only: bool = True,
    timeout_s: float | None = None,
    stale_derived_ok: bool = False,
    create: bool = True,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store for the duration of a `with` block, creating it when writing.

    A store whose derived tables another tracelab version computed is refused (StoreError
    naming `tracelab rederive`) unless `stale_derived_ok`: that command's own open.

    Read-only opens of a missing file fail with a message that says how to create one, and so
    do writers that only change an existing store (`create=False`: delete, rederive, baseline),
    rather than leave an empty store at a mistyped path.
    """
    path = os.fspath(path)
    if timeout_s is None:
        timeout_s = env_seconds("TRACELAB_LOCK_TIMEOUT_S", DEFAULT_LOCK_TIMEOUT_S)
    if (read_only or not create) and path != ":memory:" and not Path(path).exists():
        raise StoreError(
            f"{path}: no store here. Create one with `tracelab ingest TRACES --db {path}`."
        )
    check_owner(path, claim=not read_only)  # before a writer creates a file beside another's
    con = connect_with_retry(path, read_only, timeout_s)
    try:
        with interruptible(con):
            if read_only:
                check_version(con, path, check_derived=not stale_derived_ok)
            else:
                con.execute("SET memory_limit = ?", [WRITER_MEMORY_LIMIT])
                # DuckDB draws its own bar on long statements; ingest shows one for the whole job.
                con.execute("SET enable_progress_bar = false")
                ensure_schema(con, path, check_derived=not stale_derived_ok)
            check_duckdb_storage(con, path)
            follow_moved_store(con, read_only=read_only)
            if not read_only:
                sweep(con)  # what a killed writer left in the store folder
            try:
                yield con
            finally:
                if not read_only:  # a deleted or replaced run's files; never fails the caller
                    with contextlib.suppress(duckdb.Error, OSError):
                        sweep(con)
    finally:
        con.close()


def store_cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of a store connection (open_store's) that reads what the connection reads. A
    moved store's reader reads its files through temporary views over where they are now
    (follow_moved_store), and DuckDB's temporary objects belong to one connection: a bare
    cursor read the store's old folder ("No files found" in every view of `tracelab open` on a
    store moved with its folder)."""
    cur = con.cursor()
    try:
        follow_moved_store(cur, read_only=True)
    except BaseException:
        cur.close()
        raise
    return cur
