"""The DuckDB store: opening it safely, its schema version, and run bookkeeping.

DuckDB admits one read-write process or many read-only processes per file, never both, and a
second opener fails at once rather than waiting (DuckDB "Concurrency" documentation). tracelab therefore keeps
every connection short: the ingest parses and converts traces *before* it opens the store, and
holds the write lock only for the final transaction; readers (the CLI, the dashboard) open the
store per request. Both sides retry on a lock conflict with a bounded back-off, so a dashboard
keeps serving while an ingest runs next to it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import duckdb

from tracelab.defaults import DEFAULT_DB, env_seconds
from tracelab.errors import RunNotFoundError, StoreError, StoreLockedError

SCHEMA_VERSION = 2
#: The schema's files, in the order they are executed: the base tables, then the derived layer.
SCHEMA_FILES = ("tables.sql", "derived.sql")
#: Version of what tracelab.derived computes into the derived tables. Bumped whenever a
#: definition changes, so that a store derived by an older tracelab is re-derived
#: (`tracelab rederive`) rather than shown with numbers that no longer mean the same.
DERIVED_VERSION = 2
#: DuckDB's buffer memory for a writer. DuckDB keeps written blocks cached up to its limit (80%
#: of RAM by default), which would make an ingest's RSS grow with the run's size.
WRITER_MEMORY_LIMIT = os.environ.get("TRACELAB_WRITER_MEMORY_LIMIT", "1GB")
#: How long an opener waits for another process to release the file, in seconds
#: (TRACELAB_LOCK_TIMEOUT_S overrides it, read at each open).
DEFAULT_LOCK_TIMEOUT_S = 60.0


def schema_sql() -> str:
    """The DDL of the current schema version (documented column by column in the files)."""
    return "\n".join(
        resources.files("tracelab").joinpath(f"schema/{name}").read_text() for name in SCHEMA_FILES
    )


_CREATE = re.compile(r"^CREATE (?:TABLE IF NOT EXISTS|OR REPLACE VIEW) (\w+)")
_COLUMN = re.compile(r"^\s+(\w+) [A-Z]")
_VIEW_COLUMN = re.compile(r"^-- @column (\w+): (.*)$")


def schema_comments(sql: str) -> list[tuple[str, str, str | None, str]]:
    """(kind, table, column, text) for every documented table, view and column of `sql`: the
    `-- ` lines right above a CREATE or a column definition, and a view's `-- @column name:
    text` lines after it. The schema files are the one place the columns are described; this
    copies that text into DuckDB's catalog, where DESCRIBE and duckdb_columns() show it."""
    out: list[tuple[str, str, str | None, str]] = []
    pending: list[str] = []
    table: str | None = None
    for line in sql.splitlines():
        stripped = line.strip()
        view_col = _VIEW_COLUMN.match(stripped)
        if view_col and table:
            out.append(("column", table, view_col.group(1), view_col.group(2)))
            continue
        if stripped.startswith("--"):
            pending.append(stripped[2:].strip())
            continue
        created = _CREATE.match(stripped)
        column = _COLUMN.match(line)
        if created:
            table = created.group(1)
            if pending:
                out.append(("table", table, None, " ".join(pending)))
        elif column and table and pending and column.group(1).upper() != "PRIMARY":
            out.append(("column", table, column.group(1), " ".join(pending)))
        pending = []
    return out


def _apply_comments(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    for kind, table, column, text in schema_comments(sql):
        quoted = "'" + text.replace("'", "''") + "'"
        if kind == "table":
            is_view = con.execute(
                "SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [table]
            ).fetchall()[0][0]
            con.execute(f"COMMENT ON {'VIEW' if is_view else 'TABLE'} {table} IS {quoted}")
        else:
            con.execute(f"COMMENT ON COLUMN {table}.{column} IS {quoted}")


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
                raise _unopenable_store_error(path, exc) from exc
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{path}: another process has held the store for over {timeout_s:.0f} s "
                    f"({exc}). Wait for it to finish, or raise TRACELAB_LOCK_TIMEOUT_S."
                ) from exc
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


def _one(cur: duckdb.DuckDBPyConnection) -> tuple | None:
    """The first row of a result, read through: DuckDB 2 refuses the connection's next
    relational query while a result is unread (fetchone leaves it so)."""
    rows = cur.fetchall()
    return rows[0] if rows else None


def _check_version(con: duckdb.DuckDBPyConnection, path: str, check_derived: bool = True) -> None:
    try:
        row = _one(con.execute("SELECT value FROM tracelab_meta WHERE key = 'schema_version'"))
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
    if check_derived:
        derived = stored_derived_version(con)
        if derived != DERIVED_VERSION:
            raise StoreError(
                f"{path}: the store's derived tables were computed by another tracelab "
                f"(derived version {derived}; this one computes version {DERIVED_VERSION}). "
                f"Recompute them, keeping every event: tracelab rederive --db {path}"
            )


def rederive_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the derived tables and create them as this tracelab defines them (their rows are
    recomputed from the base tables by tracelab.derived; no event is touched)."""
    sql = resources.files("tracelab").joinpath("schema/derived.sql").read_text()
    con.execute("BEGIN")
    try:
        made = [
            (m.group(1), "VIEW" in line)
            for line in sql.splitlines()
            if (m := _CREATE.match(line.strip()))
        ]
        for name, is_view in sorted(made, key=lambda x: not x[1]):  # views first
            con.execute(f"DROP {'VIEW' if is_view else 'TABLE'} IF EXISTS {name}")
        con.execute(sql)
        _apply_comments(con, sql)
        con.execute(
            "INSERT OR REPLACE INTO tracelab_meta VALUES ('derived_version', ?)",
            [str(DERIVED_VERSION)],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def stored_derived_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The derived version the store's derived tables were computed with."""
    row = _one(con.execute("SELECT value FROM tracelab_meta WHERE key = 'derived_version'"))
    return int(row[0]) if row else None


@contextlib.contextmanager
def open_store(
    path: str | os.PathLike[str] = DEFAULT_DB,
    *,
    read_only: bool = True,
    timeout_s: float | None = None,
    stale_derived_ok: bool = False,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store for the duration of a `with` block, creating it when writing.

    A store whose derived tables another tracelab version computed is refused (StoreError
    naming `tracelab rederive`) unless `stale_derived_ok`: that command's own open.

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
            _check_version(con, path, check_derived=not stale_derived_ok)
        else:
            con.execute("SET memory_limit = ?", [WRITER_MEMORY_LIMIT])
            # DuckDB draws its own bar on long statements; ingest shows one for the whole job.
            con.execute("SET enable_progress_bar = false")
            ensure_schema(con, path, check_derived=not stale_derived_ok)
        _check_duckdb_storage(con, path)
        yield con
    finally:
        con.close()


def ensure_schema(
    con: duckdb.DuckDBPyConnection, path: str = "<store>", *, check_derived: bool = True
) -> None:
    """Create the schema in an empty database, or check the version of an existing one."""
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tracelab_meta'"
    ).fetchall()[0][0]
    if has_meta:
        _check_version(con, path, check_derived)
        return
    others = con.execute("SELECT count(*) FROM information_schema.tables").fetchall()[0][0]
    if others:
        raise StoreError(
            f"{path}: this DuckDB file holds other tables and is not a tracelab store. "
            "Use a new file for --db."
        )
    con.execute("BEGIN")
    sql = schema_sql()
    con.execute(sql)
    _apply_comments(con, sql)
    con.execute(
        "INSERT INTO tracelab_meta VALUES ('schema_version', ?), ('derived_version', ?)",
        [str(SCHEMA_VERSION), str(DERIVED_VERSION)],
    )
    _record_duckdb_storage(con)
    con.execute("COMMIT")


# The DuckDB file format. DuckDB 2.0 writes files that 1.x cannot read, and a newer DuckDB may
# write data into an older store that its writer can no longer read. So the store records the
# storage version (and the DuckDB release) that created it beside the schema version, and a
# DuckDB that writes another storage version is refused with both versions named.


def duckdb_storage_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The storage version of the connection's database file as DuckDB names it ('v2.0.0+');
    None for an in-memory database."""
    row = _one(
        con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = current_database()")
    )
    tags = row[0] if row else None
    return str(tags["storage_version"]) if tags and tags.get("storage_version") else None


@functools.cache
def _native_storage_version() -> str | None:
    """The storage version the installed DuckDB writes new files in (a throwaway file's)."""
    try:
        with tempfile.TemporaryDirectory(prefix="tracelab-probe-") as tmp:
            con = duckdb.connect(os.path.join(tmp, "probe.duckdb"))
            try:
                return duckdb_storage_version(con)
            finally:
                con.close()
    except (OSError, duckdb.Error):
        return None


def _record_duckdb_storage(con: duckdb.DuckDBPyConnection) -> None:
    """Store the DuckDB storage version and release beside the schema version (new stores)."""
    con.executemany(
        "INSERT OR REPLACE INTO tracelab_meta VALUES (?, ?)",
        [
            [
                "duckdb_storage_version",
                duckdb_storage_version(con) or _native_storage_version() or "unknown",
            ],
            ["duckdb_version", duckdb.__version__],
        ],
    )


def _check_duckdb_storage(con: duckdb.DuckDBPyConnection, path: str) -> None:
    """Refuse a store created by a DuckDB that writes another storage version than this one."""
    meta = dict(
        con.execute(
            "SELECT key, value FROM tracelab_meta "
            "WHERE key IN ('duckdb_storage_version', 'duckdb_version')"
        ).fetchall()
    )
    stored = meta.get("duckdb_storage_version")
    if stored is None or stored == "unknown":  # a store from before tracelab recorded it
        return
    series = duckdb.__version__.split(".")[:2]
    if (
        stored == duckdb_storage_version(con)
        and meta.get("duckdb_version", "").split(".")[:2] == series
    ):
        return  # the same DuckDB series made it: no need to probe
    here = _native_storage_version()
    if here is None or stored == here:
        return
    writer = meta.get("duckdb_version")
    raise StoreError(
        f"{path}: this store was written by DuckDB {writer or 'another release'} (storage "
        f"version {stored}), but the installed DuckDB {duckdb.__version__} writes storage "
        f"version {here}. Use the store with the DuckDB that wrote it"
        + (f" (pip install 'duckdb=={writer}')" if writer else "")
        + ", or re-ingest the traces into a new store (--db NEW.duckdb)."
    )


def _unopenable_store_error(path: str, exc: Exception) -> StoreError:
    """A StoreError for a file DuckDB refused; it names both DuckDB versions when the file's
    storage version is the reason."""
    text = str(exc)
    if "storage version" not in text:
        return StoreError(f"{path}: cannot open the store: {exc}")
    found = re.search(r"storage version number (\d+)", text)
    readable = re.search(r"between (\d+) and (\d+)", text)
    writer = _header_writer(path)
    return StoreError(
        f"{path}: this store was written by DuckDB {writer or 'another version'}"
        + (f" (storage version {found.group(1)})" if found else "")
        + f", which the installed DuckDB {duckdb.__version__} cannot read"
        + (
            f" (it reads storage versions {readable.group(1)}-{readable.group(2)})"
            if readable
            else ""
        )
        + ". Open it with the DuckDB that wrote it"
        + (f" (pip install 'duckdb=={writer.lstrip('v')}')" if writer else "")
        + ", or re-ingest the traces into a new store (--db NEW.duckdb)."
    )


def _header_writer(path: str) -> str | None:
    """The DuckDB release recorded in a database file's main header ('v2.0.1'), if any."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(96)
    except OSError:
        return None
    found = re.match(rb"v\d+\.\d+\.\d+[\w.-]*", head[52:84].rstrip(b"\0"))
    return found.group(0).decode() if found else None


def run_id(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """The id of the run called `name`; a clear error listing the runs that exist otherwise."""
    row = _one(con.execute("SELECT run_id FROM runs WHERE name = ?", [name]))
    if row is None:
        names = [r[0] for r in con.execute("SELECT name FROM runs ORDER BY run_id").fetchall()]
        known = ", ".join(names[:20]) or "none: ingest some traces first"
        raise RunNotFoundError(f"no run named {name!r} in the store. Runs: {known}.")
    return int(row[0])


def resolve_run(con: duckdb.DuckDBPyConnection, name: str | None) -> tuple[int, str]:
    """(run_id, name) for `name`, or for the newest run when `name` is None."""
    if name is not None:
        return run_id(con, name), name
    row = _one(con.execute("SELECT run_id, name FROM runs ORDER BY run_id DESC LIMIT 1"))
    if row is None:
        raise RunNotFoundError("the store holds no runs yet. Ingest traces with `tracelab ingest`.")
    return int(row[0]), str(row[1])


#: Tables holding per-run rows, deleted together with the run (derived ones first).
RUN_TABLES = (
    "step_spans",
    "clock_offsets",
    "matched_collectives",
    "p2p_ops",
    "time_parts",
    "step_parts",
    "comm_attribution",
    "pipeline_actions",
    "pipeline_runs",
    "pipeline_ranks",
    "derived_errors",
    "events",
    "steps",
    "lanes",
    "collectives",
    "memory",
    "ranks",
    "runs",
)


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
