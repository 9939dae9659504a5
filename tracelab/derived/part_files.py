"""time_parts as Parquet files in the store folder: the one derived table that grows with the
events (about one segment for every two events), kept out of the DuckDB file.

A large insert inside a DuckDB transaction is held in memory until the commit (measured: 40
bytes a row, past the memory limit), and an ingest derives a run inside the transaction that
builds it (in its staged store); with time_parts in the file, a 1,000-rank run of 100k events
a rank peaked at 4.8 GB. So each batch of ranks (tracelab.derived.batches) writes its segments
to its own file, `run=ID/parts/time_parts-RANK-TOKEN.parquet` in the folder of the store it
derives in (RANK: the batch's first rank; TOKEN: new for every derivation, so a rederive never
overwrites a file a reader may be reading), whole under a
temporary name and then renamed. The files are listed in `parquet_files` (kind 'time_parts') in
the caller's transaction, and the `time_parts` view over the listed files is replaced in it:
a reader sees the run's old segments or its new ones, never a mix. The files a derivation
replaced, and those of one that was killed, are unlisted, and the store's writer removes them
(tracelab.store.files.sweep).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracelab.derived import sqlfiles
from tracelab.derived.sqlcomments import apply_comments
from tracelab.store_folder import (
    PARQUET_FILES_COLUMNS,
    listed,
    parts_select_sql,
    run_folder,
    store_root,
    view_over_listed,
)

#: parquet_files.kind of these files.
KIND = "time_parts"
#: Rows per row group: a reader's filter on rank skips the others' groups by their statistics.
ROW_GROUP = 122_880


def new_token() -> str:
    """A name part no earlier derivation used."""
    return uuid.uuid4().hex[:12]


def write_batch(
    root: Path, run_id: int, parts: pa.Table, token: str
) -> tuple[int, str, int, int] | None:
    """Write one batch's segments (rank, step, start_ns, end_ns, part; ordered by rank and
    start) to its file in the store folder `root` (make_root); returns (first rank, path in the store folder, rows, bytes), or None
    for a batch without segments."""
    if not len(parts):
        return None
    first = int(parts.column("rank")[0].as_py())
    rel = f"{run_folder(run_id)}/parts/{KIND}-{first}-{token}.parquet"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    table = parts.select(["rank", "step", "start_ns", "end_ns", "part"])
    table = table.add_column(0, "run_id", pa.array([int(run_id)] * len(table), pa.int32()))
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial, compression="zstd", row_group_size=ROW_GROUP)
    os.replace(partial, path)
    return first, rel, len(table), path.stat().st_size


def register(
    con: duckdb.DuckDBPyConnection, run_id: int, files: list[tuple[int, str, int, int]]
) -> None:
    """List the run's new files in place of its old ones, and replace the view (in the caller's
    transaction)."""
    con.execute("DELETE FROM parquet_files WHERE run_id = ? AND kind = ?", [int(run_id), KIND])
    sqlfiles.insert_rows(
        con,
        "parquet_files",
        PARQUET_FILES_COLUMNS,
        [[int(run_id), first, KIND, rel, rows, size] for first, rel, rows, size in files],
    )
    refresh_view(con)


def unlist(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Drop the run's segments (its files are removed by the store's next sweep)."""
    register(con, run_id, [])


def refresh_view(con: duckdb.DuckDBPyConnection, *, temp: bool = False) -> None:
    """Make `time_parts` the view over the files parquet_files lists now, with its comments (a
    TEMP view, without them, for a reader of a store that moved with its folder)."""
    root = store_root(con)
    paths = listed(con, KIND)
    ddl = sqlfiles.ddl(KIND)
    if root is None or not paths:
        sql = ddl[ddl.index("CREATE OR REPLACE VIEW") :]
    else:
        sql = f"CREATE OR REPLACE VIEW time_parts AS {parts_select_sql(root, paths)}"
    if temp:
        sql = sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1)
    view_over_listed(con, sql, root, paths)
    if not temp:
        apply_comments(con, ddl, only=KIND)
