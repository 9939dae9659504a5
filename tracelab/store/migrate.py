"""Migrating a store of schema version 2 or 3 (events in a DuckDB table; 3 added hang_verdicts)
to version 4 (events as Parquet files in the store folder, `events` a view over them), in place,
keeping every run.

The files are written first, each under a temporary name renamed when whole; then one
transaction drops the events table, lists the files and sets the version. A migration killed
before its commit leaves the store as it was (its files are removed by the next writer, or
overwritten by the next migration); after it, a version 4 store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tracelab.errors import StoreError
from tracelab.store.files import (
    EVENT_FILE_COLUMNS,
    event_file,
    make_root,
    register_files,
)
from tracelab.store.open import DEFAULT_LOCK_TIMEOUT_S, connect_with_retry
from tracelab.store.schema import SCHEMA_FILES, apply_comments
from tracelab.store.versions import SCHEMA_VERSION, first_row

#: Row groups of the migrated files, as the converter writes them (tracelab.ingest.convert).
_ROW_GROUP = 122_880


@dataclass(frozen=True, kw_only=True)
class Migrated:
    """What a migration did."""

    from_version: int
    files: int
    events: int


def migrate_store(path: str | os.PathLike[str]) -> Migrated:
    """Migrate the store at `path` to SCHEMA_VERSION; a store already there is left as it is."""
    path = os.fspath(path)
    if not Path(path).is_file():
        raise StoreError(f"{path}: no store here. Give the store file with --db.")
    con = connect_with_retry(path, False, DEFAULT_LOCK_TIMEOUT_S)
    try:
        row = first_row(con.execute("SELECT value FROM tracelab_meta WHERE key = 'schema_version'"))
        found = int(row[0]) if row else None
        if found == SCHEMA_VERSION:
            return Migrated(from_version=found, files=0, events=0)
        if found not in (2, 3):
            raise StoreError(
                f"{path}: store schema version {found}; `tracelab migrate` migrates version 2 "
                "and 3 stores. Re-ingest the traces into a new store (--db NEW.duckdb)."
            )
        root = make_root(con)
        groups = con.execute(
            "SELECT run_id, rank, count(*) FROM events GROUP BY run_id, rank ORDER BY run_id, rank"
        ).fetchall()
        files = [(int(rid), int(rank), int(n)) for rid, rank, n in groups]
        cols = ", ".join(
            "CAST(args AS VARCHAR) AS args" if c == "args" else c for c in EVENT_FILE_COLUMNS
        )
        for rid, rank, _ in files:
            final = root / event_file(rid, rank, 0)
            final.parent.mkdir(parents=True, exist_ok=True)
            partial = final.with_name(final.name + ".partial")
            # COPY takes no bind parameters: the ids are ints, the path is quoted.
            con.execute(
                f"COPY (SELECT {cols} FROM events WHERE run_id = {rid} AND rank = {rank} "
                f"ORDER BY idx) TO '{str(partial).replace(chr(39), chr(39) * 2)}' "
                f"(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE {_ROW_GROUP})"
            )
            os.replace(partial, final)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DROP TABLE events")
            tables = "\n".join(
                resources.files("tracelab").joinpath(f"store/schema/{f}").read_text()
                for f in SCHEMA_FILES
            )
            con.execute(tables)  # parquet_files, the empty events view (and hang_verdicts, from 2)
            apply_comments(con, tables)
            by_run: dict[int, list[tuple[int, int, int]]] = {}
            for rid, rank, n in files:
                by_run.setdefault(rid, []).append((rank, 0, n))
            for rid, listed in by_run.items():
                register_files(con, rid, listed)
            con.execute(
                "UPDATE tracelab_meta SET value = ? WHERE key = 'schema_version'",
                [str(SCHEMA_VERSION)],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("CHECKPOINT")
        return Migrated(from_version=found, files=len(files), events=sum(n for *_, n in files))
    finally:
        con.close()
