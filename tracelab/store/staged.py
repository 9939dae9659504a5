"""A run built in a store of its own, then moved into the store: readers wait for the move only.

DuckDB lets no process open a file that another process writes (tracelab.store.open), so all
that an ingest does while it holds the store's write lock blocks every reader. Loading a run's
small tables and deriving its tables inside the write took 3.58 s of a 9.3 s 16-rank ingest, and
a third of a 1,000-rank one's. So an ingest builds its run in a *staged store*: a DuckDB file in
its staging folder, of the store's schema, with its own Parquet folder beside it, that no reader
knows of. The run's events files are staged in that folder and its time_parts files written
there, in the store folder's layout (`run=ID/...`), and its rows go to the staged store's tables.
The store's write lock is then taken for move_run only: the run's folder renamed into the store
folder, then its rows copied, its files listed and the views replaced in one transaction.

The run's id is handed out by the store before the build (its sequence never hands an id out
twice), so the staged rows and files carry the id they keep. A staged store is never opened as
a store: it lives and dies with its ingest's staging folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from tracelab.connections import connect
from tracelab.derived import part_files
from tracelab.interrupts import interruptible
from tracelab.store.files import place_run, refresh_file_views
from tracelab.store.open import WRITER_MEMORY_LIMIT, rollback
from tracelab.store.runs import ROW_TABLES, delete_run
from tracelab.store.schema import schema_sql
from tracelab.store_folder import parquet_root, run_folder, sql_text

#: The staged store's name in the store's connection while its run is moved.
_SOURCE = "tl_staged"


@contextlib.contextmanager
def staged_store(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A new staged store at `path`: the store's tables and views, without the comments that
    the store copies into DuckDB's catalog for its readers (0.1 s)."""
    con = connect(str(path))
    try:
        with interruptible(con):
            con.execute("SET memory_limit = ?", [WRITER_MEMORY_LIMIT])
            con.execute("SET enable_progress_bar = false")
            con.execute(schema_sql())
            yield con
    finally:
        con.close()


def move_run(
    con: duckdb.DuckDBPyConnection, staged: Path, run_id: int, *, replacing: int | None = None
) -> None:
    """Move run `run_id` of the staged store `staged` (closed) into the store that `con` holds
    for writing, in place of run `replacing`: its folder into the store folder (place_run), then
    its rows, the listing of its files and the views over them in one transaction. What a failed
    move placed is unlisted, and the store's writer removes it (tracelab.store.files.sweep)."""
    place_run(con, parquet_root(staged) / run_folder(run_id), run_id)
    con.execute(f"ATTACH {sql_text(str(staged))} AS {_SOURCE} (READ_ONLY)")
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            if replacing is not None:
                delete_run(con, replacing, refresh_views=False)
            for table in reversed(ROW_TABLES):
                con.execute(
                    f"INSERT INTO {table} BY NAME SELECT * FROM {_SOURCE}.{table} WHERE run_id = ?",
                    [int(run_id)],
                )
            refresh_file_views(con)
            part_files.refresh_view(con)
            con.execute("COMMIT")
        except BaseException:
            rollback(con)
            raise
    finally:
        con.execute(f"DETACH {_SOURCE}")
