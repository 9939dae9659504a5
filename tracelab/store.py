"""The DuckDB store: opening it safely, its schema version, and run bookkeeping.

DuckDB admits one read-write process or many read-only processes per file, never both, and a
second opener fails at once rather than waiting (FACTS.md section 7). tracelab therefore keeps
every connection short: the ingest parses and converts traces *before* it opens the store, and
holds the write lock only for the final transaction; readers (the CLI, the dashboard) open the
store per request. Both sides retry on a lock conflict with a bounded back-off, so a dashboard
keeps serving while an ingest runs next to it.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import duckdb

from tracelab.defaults import DEFAULT_DB, env_seconds
from tracelab.errors import RunNotFoundError, StoreError, StoreLockedError

SCHEMA_VERSION = 1
#: DuckDB's buffer memory for a writer. DuckDB keeps written blocks cached up to its limit (80%
#: of RAM by default), which would make an ingest's RSS grow with the run's size.
WRITER_MEMORY_LIMIT = os.environ.get("TRACELAB_WRITER_MEMORY_LIMIT", "1GB")
#: How long an opener waits for another process to release the file, in seconds
#: (TRACELAB_LOCK_TIMEOUT_S overrides it, read at each open).
DEFAULT_LOCK_TIMEOUT_S = 60.0


def schema_sql() -> str:
    """The DDL of the current schema version (documented column by column in the file)."""
    return resources.files("tracelab").joinpath(f"schema/v{SCHEMA_VERSION}.sql").read_text()


def _is_lock_conflict(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


def _connect_with_retry(path: str, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.IOException as exc:
            if not _is_lock_conflict(exc):
                raise StoreError(f"{path}: cannot open the store: {exc}") from exc
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{path}: another process has held the store for over {timeout_s:.0f} s "
                    f"({exc}). Wait for it to finish, or raise TRACELAB_LOCK_TIMEOUT_S."
                ) from exc
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


def _check_version(con: duckdb.DuckDBPyConnection, path: str) -> None:
    try:
        row = con.execute(
            "SELECT value FROM tracelab_meta WHERE key = 'schema_version'"
        ).fetchone()
    except duckdb.CatalogException as exc:
        raise StoreError(
            f"{path}: this DuckDB file is not a tracelab store (no tracelab_meta table). "
            "Point --db at a tracelab store or at a new file."
        ) from exc
    found = int(row[0]) if row else None
    if found != SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema version {found} but this tracelab reads version "
            f"{SCHEMA_VERSION}. Re-ingest the traces into a new store (--db NEW.duckdb)."
        )


@contextlib.contextmanager
def open_store(
    path: str | os.PathLike[str] = DEFAULT_DB,
    *,
    read_only: bool = True,
    timeout_s: float | None = None,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store for the duration of a `with` block, creating it when writing.

    Read-only opens of a missing file fail with a message that says how to create one.
    """
    path = os.fspath(path)
    if timeout_s is None:
        timeout_s = env_seconds("TRACELAB_LOCK_TIMEOUT_S", DEFAULT_LOCK_TIMEOUT_S)
    if read_only and path != ":memory:" and not Path(path).exists():
        raise StoreError(
            f"{path}: no store here. Create one with `tracelab ingest TRACES --db {path}`."
        )
    con = _connect_with_retry(path, read_only, timeout_s)
    try:
        if read_only:
            _check_version(con, path)
        else:
            con.execute("SET memory_limit = ?", [WRITER_MEMORY_LIMIT])
            # DuckDB draws its own bar on long statements; ingest shows one for the whole job.
            con.execute("SET enable_progress_bar = false")
            ensure_schema(con, path)
        yield con
    finally:
        con.close()


def ensure_schema(con: duckdb.DuckDBPyConnection, path: str = "<store>") -> None:
    """Create the schema in an empty database, or check the version of an existing one."""
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tracelab_meta'"
    ).fetchone()[0]
    if has_meta:
        _check_version(con, path)
        return
    others = con.execute("SELECT count(*) FROM information_schema.tables").fetchone()[0]
    if others:
        raise StoreError(
            f"{path}: this DuckDB file holds other tables and is not a tracelab store. "
            "Use a new file for --db."
        )
    con.execute("BEGIN")
    con.execute(schema_sql())
    con.execute(
        "INSERT INTO tracelab_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)]
    )
    con.execute("COMMIT")


def run_id(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """The id of the run called `name`; a clear error listing the runs that exist otherwise."""
    row = con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchone()
    if row is None:
        names = [r[0] for r in con.execute("SELECT name FROM runs ORDER BY run_id").fetchall()]
        known = ", ".join(names[:20]) or "none: ingest some traces first"
        raise RunNotFoundError(f"no run named {name!r} in the store. Runs: {known}.")
    return int(row[0])


def resolve_run(con: duckdb.DuckDBPyConnection, name: str | None) -> tuple[int, str]:
    """(run_id, name) for `name`, or for the newest run when `name` is None."""
    if name is not None:
        return run_id(con, name), name
    row = con.execute("SELECT run_id, name FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()
    if row is None:
        raise RunNotFoundError("the store holds no runs yet. Ingest traces with `tracelab ingest`.")
    return int(row[0]), str(row[1])


#: Tables holding per-run rows, deleted together with the run.
RUN_TABLES = ("events", "steps", "lanes", "collectives", "memory", "ranks", "runs")


def delete_run(con: duckdb.DuckDBPyConnection, rid: int) -> None:
    """Delete every row of one run. Call inside a transaction to make it atomic with more work."""
    for table in RUN_TABLES:
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [rid])


def list_runs(con: duckdb.DuckDBPyConnection) -> list[dict[str, object]]:
    """Runs with their rank count, world size, step count and duration, newest first."""
    rows = con.execute(
        """
        SELECT r.run_id, r.name, r.created_at, r.rank_count, r.world_size,
               (SELECT count(DISTINCT s.step) FROM steps s WHERE s.run_id = r.run_id) AS steps,
               (SELECT (max(e.ts_ns + e.dur_ns) - min(e.ts_ns)) FROM events e
                 WHERE e.run_id = r.run_id) AS span_ns,
               json_array_length(r.skipped) AS skipped_files
        FROM runs r ORDER BY r.run_id DESC
        """
    ).fetchall()
    keys = ("run_id", "name", "created_at", "ranks", "world_size", "steps", "span_ns", "skipped")
    return [dict(zip(keys, row, strict=True)) for row in rows]
