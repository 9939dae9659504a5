"""Migrating a store of schema version 2 or 3 (events in a DuckDB table; 3 added hang_verdicts),
4 (events as Parquet files in the store folder, `events` a view over them), 5 (the collectives
table gained the all-to-all's per-peer bytes, in_split_bytes / out_split_bytes, NULL on the
rows already there: the store never kept them) or 6 (each run's distinct process-group
configurations once, in process_group_configs, each rank naming its own by number, in place of
a copy per rank) to version 7 (the trace's [memory] instants as Parquet files beside the
events, the collector's step peaks in memory_peaks, `memory` a view over both), in place,
keeping every run.

The files are written first, each under a temporary name renamed when whole; then one
transaction drops the tables the files replace, lists the files and sets the version. A
migration killed before its commit leaves the store as it was: the files it wrote are unlisted
and overwritten by the next migration (which the store needs before anything else opens it
for writing; a version 2 or 3 store's files are in unlisted run folders, which the next
writer's sweep also removes); after it, a version 7 store.
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
    make_root,
    rank_file,
    refresh_file_views,
    register_files,
)
from tracelab.store.open import DEFAULT_LOCK_TIMEOUT_S, connect_with_retry
from tracelab.store.schema import SCHEMA_FILES, apply_comments
from tracelab.store.versions import SCHEMA_VERSION, first_row
from tracelab.store_folder import MEMORY_FILE_COLUMNS, check_owner

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
    memory_files: int = 0
    memory_instants: int = 0


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
        if found not in (2, 3, 4, 5, 6):
            raise StoreError(
                f"{path}: store schema version {found}; `tracelab migrate` migrates version 2 "
                "to 6 stores. Re-ingest the traces into a new store (--db NEW.duckdb)."
            )
        root = make_root(con)
        # The files first, each renamed into place when whole; listed in the transaction below.
        files = _write_event_files(con, root) if found < 4 else []
        memory = _write_memory_files(con, root)
        con.execute("BEGIN TRANSACTION")
        try:
            tables = _tables_sql()
            _split_memory(con, tables)
            if found < 4:
                con.execute("DROP TABLE events")
                # parquet_files, the empty views (and hang_verdicts, from 2)
                con.execute(tables)
                _add_split_columns(con)
                _share_process_groups(con)
                apply_comments(con, tables)
            elif found < 6:
                if found == 4:
                    _add_split_columns(con)
                    apply_comments(con, tables, only="collectives")
                _share_process_groups(con)
            events, instants = _by_run(files), _by_run(memory)
            for rid in sorted(events.keys() | instants.keys()):
                register_files(con, rid, events.get(rid, []), instants.get(rid, []), refresh=False)
            # The views over what is listed now, once (a store of no runs: their forms without
            # files); of a store of version 4 or more only `memory`: its `events` view stays,
            # so that a store that lost an events file still migrates (and then opens, with
            # the error that names the run to delete), rather than sending the user from
            # `tracelab delete` to `tracelab migrate` and back.
            refresh_file_views(con, kinds=("events", "memory") if found < 4 else ("memory",))
            _set_version(con)
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
        con.execute("CHECKPOINT")
        return Migrated(
            from_version=found,
            files=len(files),
            events=sum(n for *_, n in files),
            memory_files=len(memory),
            memory_instants=sum(n for *_, n in memory),
        )
    finally:
        con.close()


def _by_run(files: list[tuple[int, int, int]]) -> dict[int, list[tuple[int, int, int]]]:
    """(run, rank, rows) per file -> per run, (rank, offset 0, rows) per file."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for rid, rank, n in files:
        out.setdefault(rid, []).append((rank, 0, n))
    return out


def _write_event_files(con: duckdb.DuckDBPyConnection, root: Path) -> list[tuple[int, int, int]]:
    """A version 2 or 3 store's events table as one file per run and rank: (run, rank, rows)."""
    groups = con.execute(
        "SELECT run_id, rank, count(*) FROM events GROUP BY run_id, rank ORDER BY run_id, rank"
    ).fetchall()
    files = [(int(rid), int(rank), int(n)) for rid, rank, n in groups]
    cols = ", ".join(
        "CAST(args AS VARCHAR) AS args" if c == "args" else c for c in EVENT_FILE_COLUMNS
    )
    for rid, rank, _ in files:
        _copy_to(
            con,
            f"SELECT {cols} FROM events WHERE run_id = {rid} AND rank = {rank} ORDER BY idx",
            root / rank_file(rid, rank, "events", 0),
        )
    return files


def _write_memory_files(con: duckdb.DuckDBPyConnection, root: Path) -> list[tuple[int, int, int]]:
    """The memory table's trace instants (version 6 and before) as one file per run and rank,
    in the converter's columns (tracelab.store_folder.MEMORY_FILE_COLUMNS): (run, rank, rows)."""
    groups = con.execute(
        "SELECT run_id, rank, count(*) FROM memory WHERE source = 'trace' "
        "GROUP BY run_id, rank ORDER BY run_id, rank"
    ).fetchall()
    files = [(int(rid), int(rank), int(n)) for rid, rank, n in groups]
    cols = ", ".join(f"{name} AS {column}" for name, column in MEMORY_FILE_COLUMNS.items())
    for rid, rank, _ in files:
        _copy_to(
            con,
            f"SELECT {cols} FROM memory WHERE run_id = {rid} AND rank = {rank} "
            "AND source = 'trace' ORDER BY rowid",  # (as stored: the traces' order)
            root / rank_file(rid, rank, "memory", 0),
        )
    return files


def _copy_to(con: duckdb.DuckDBPyConnection, select: str, final: Path) -> None:
    """The rows of `select` written to `final`, under a temporary name renamed when whole."""
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".partial")
    # COPY takes no bind parameters: the ids are ints, the path is quoted.
    con.execute(
        f"COPY ({select}) TO '{str(partial).replace(chr(39), chr(39) * 2)}' "
        f"(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE {_ROW_GROUP})"
    )
    os.replace(partial, final)


def _split_memory(con: duckdb.DuckDBPyConnection, tables: str) -> None:
    """Version 7: the memory table's collector step peaks into memory_peaks, the table dropped
    (its trace instants were written to files: _write_memory_files; `memory` becomes a view)."""
    con.execute(_create_sql(tables, "memory_peaks"))
    con.execute("INSERT INTO memory_peaks BY NAME SELECT * FROM memory WHERE source <> 'trace'")
    con.execute("DROP TABLE memory")
    apply_comments(con, tables, only="memory_peaks")


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
