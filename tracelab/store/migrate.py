"""Migrating a store of schema version 2 or 3 (events in a DuckDB table; 3 added hang_verdicts),
4 (events as Parquet files in the store folder, `events` a view over them) or 5 (the
collectives table gained the all-to-all's per-peer bytes, in_split_bytes / out_split_bytes,
NULL on the rows already there: the store never kept them) to version 6 (each run's distinct
process-group configurations once, in process_group_configs, each rank naming its own by
number, in place of a copy per rank), in place, keeping every run.

The files are written first, each under a temporary name renamed when whole; then one
transaction drops the events table, lists the files and sets the version. A migration killed
before its commit leaves the store as it was (its files are removed by the next writer, or
overwritten by the next migration); after it, a version 6 store. A version 4 or 5 store only
changes its tables, in one transaction.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tracelab.derived.sqlfiles import rollback
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
from tracelab.store_folder import check_owner

if TYPE_CHECKING:
    import duckdb

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
    # As every writer's opening does: the folder it writes may be another store's (x and
    # x.duckdb share x.parquet/), whose events files a migration overwrote.
    check_owner(path, claim=True)
    con = connect_with_retry(path, False, DEFAULT_LOCK_TIMEOUT_S)
    try:
        row = first_row(con.execute("SELECT value FROM tracelab_meta WHERE key = 'schema_version'"))
        found = int(row[0]) if row else None
        if found == SCHEMA_VERSION:
            return Migrated(from_version=found, files=0, events=0)
        if found not in (2, 3, 4, 5):
            raise StoreError(
                f"{path}: store schema version {found}; `tracelab migrate` migrates version 2, "
                "3, 4 and 5 stores. Re-ingest the traces into a new store (--db NEW.duckdb)."
            )
        if found in (4, 5):
            con.execute("BEGIN TRANSACTION")
            try:
                if found == 4:
                    _add_split_columns(con)
                    apply_comments(con, _tables_sql(), only="collectives")
                _share_process_groups(con)
                _set_version(con)
                con.execute("COMMIT")
            except BaseException:
                rollback(con)
                raise
            con.execute("CHECKPOINT")
            return Migrated(from_version=found, files=0, events=0)
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
            tables = _tables_sql()
            con.execute(tables)  # parquet_files, the empty events view (and hang_verdicts, from 2)
            _add_split_columns(con)
            _share_process_groups(con)
            apply_comments(con, tables)
            by_run: dict[int, list[tuple[int, int, int]]] = {}
            for rid, rank, n in files:
                by_run.setdefault(rid, []).append((rank, 0, n))
            for rid, listed in by_run.items():
                register_files(con, rid, listed)
            _set_version(con)
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
        con.execute("CHECKPOINT")
        return Migrated(from_version=found, files=len(files), events=sum(n for *_, n in files))
    finally:
        con.close()


def _tables_sql() -> str:
    """The store's own schema files (not the derived layer's)."""
    return "\n".join(
        resources.files("tracelab").joinpath(f"store/schema/{f}").read_text() for f in SCHEMA_FILES
    )


def _add_split_columns(con: duckdb.DuckDBPyConnection) -> None:
    """Version 5's columns of collectives, NULL on the rows already there."""
    for column in ("in_split_bytes", "out_split_bytes"):
        con.execute(f"ALTER TABLE collectives ADD COLUMN IF NOT EXISTS {column} BIGINT[]")


def _create_sql(tables: str, table: str) -> str:
    """The CREATE TABLE of `table` in the store's schema files (their text, `tables`)."""
    found = re.search(rf"^CREATE TABLE IF NOT EXISTS {table} \(.*?^\);$", tables, re.M | re.S)
    assert found is not None, f"tables.sql defines {table}"
    return found.group(0)


def _share_process_groups(con: duckdb.DuckDBPyConnection) -> None:
    """Version 6: each run's distinct process-group configurations once, numbered in the order
    of the lowest rank holding each, and each rank's number in place of its copy. The ranks
    table is made again (DuckDB cannot alter a table whose primary key holds rows changed in
    the same transaction)."""
    tables = _tables_sql()
    con.execute(_create_sql(tables, "process_group_configs"))
    con.execute(
        """
        INSERT INTO process_group_configs
        SELECT run_id, CAST(row_number() OVER (PARTITION BY run_id ORDER BY first) - 1 AS INTEGER),
               groups
        FROM (SELECT run_id, min(rank) AS first, any_value(process_groups) AS groups FROM ranks
              GROUP BY run_id, CAST(process_groups AS VARCHAR))
        """
    )
    con.execute(
        """
        CREATE TEMP TABLE _tl_ranks AS
        SELECT r.* EXCLUDE (process_groups), c.config AS process_groups_config
        FROM ranks r JOIN process_group_configs c ON c.run_id = r.run_id
             AND CAST(c.process_groups AS VARCHAR) = CAST(r.process_groups AS VARCHAR)
        """
    )
    con.execute("DROP TABLE ranks")
    con.execute(_create_sql(tables, "ranks"))
    con.execute("INSERT INTO ranks BY NAME SELECT * FROM _tl_ranks")
    con.execute("DROP TABLE _tl_ranks")
    for table in ("ranks", "process_group_configs"):
        apply_comments(con, tables, only=table)


def _set_version(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "UPDATE tracelab_meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
    )
