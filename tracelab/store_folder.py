"""Where a store keeps its Parquet files: the folder beside the store file (`x/STORE.duckdb` ->
`x/STORE.parquet/`), marked as tracelab's own. Shared by the store (tracelab.store.files: the
events files, the catalog, the sweep) and the derived layer (the files of its per-rank tables,
tracelab.derived.part_files), which sits below the store."""

from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb

from tracelab.errors import StoreError

#: The file that marks a folder as a store's Parquet folder (its text: the store file's name).
MARKER = ".tracelab-store"
#: Suffix of the store folder's name, replacing the store file's `.duckdb`.
FOLDER_SUFFIX = ".parquet"

#: The columns of parquet_files, the catalog of the store folder's files.
PARQUET_FILES_COLUMNS = ("run_id", "rank", "kind", "path", "row_count", "file_bytes")

#: The columns of an events file, in the view's order (run_id and rank come from the path).
EVENT_FILE_COLUMNS = (
    "idx",
    "cat",
    "name",
    "pid",
    "tid",
    "lane_label",
    "ts_ns",
    "dur_ns",
    "category",
    "on_device",
    "stream",
    "correlation",
    "external_id",
    "step",
    "args",
)

#: The columns of the `memory` view that a trace's memory file (the converted folder's
#: memory.parquet, tracelab.ingest.convert) holds after run_id, rank and source: view column ->
#: the file's column; MEMORY_CASTS are read as INTEGER (the file's are BIGINT).
MEMORY_FILE_COLUMNS = {
    "ts_ns": "ts_ns",
    "step": "step",
    "device_type": "device_type",
    "device_id": "device_id",
    "delta_bytes": "bytes",
    "allocated_bytes": "total_allocated",
    "reserved_bytes": "total_reserved",
}
MEMORY_CASTS = frozenset({"device_type", "device_id"})

#: run_id, rank and the offset of an events or memory file (`run=ID/rank=R/KIND-OFFSET.parquet`;
#: OFFSET: the rank's events, or memory instants, in its earlier windows, added to idx), read
#: from each file's name: DuckDB evaluates them once per file, and prunes the files a filter on
#: run_id or rank excludes before opening them. Not hive partitioning, which would also take
#: `k=v` folders above the store as columns.
_FROM_NAME = r"CAST(regexp_extract(filename, '[/\\]run=(\d+)[/\\]rank=(\d+)[/\\](?:events|memory)-(\d+)\.parquet$', {}) AS {})"


#: The name of a run's folder in the store folder, and in a staged store's: `run=ID`.
RUN_FOLDER = re.compile(r"run=(\d+)")


def run_folder(run_id: int) -> str:
    """Run `run_id`'s folder in the store folder (RUN_FOLDER)."""
    return f"run={int(run_id)}"


def parquet_root(db_path: str | os.PathLike[str]) -> Path:
    """The store folder of the store file `db_path`: `x/STORE.duckdb` -> `x/STORE.parquet`."""
    path = Path(os.path.abspath(db_path))
    return path.with_name(path.name.removesuffix(".duckdb") + FOLDER_SUFFIX)


def _db_file(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The store file `con` is connected to; None for an in-memory database."""
    rows = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    return Path(os.path.abspath(rows[0][0])) if rows and rows[0][0] else None


def store_root(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The store folder of the database `con` is connected to; None for an in-memory one."""
    db = _db_file(con)
    return parquet_root(db) if db is not None else None


def _is_duckdb_file(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(12)[8:12] == b"DUCK"
    except OSError:
        return False


def check_owner(db_path: str | os.PathLike[str], *, claim: bool) -> None:
    """Refuse a store file whose folder belongs to another store beside it.

    Two store files map to one folder: `x/STORE` and `x/STORE.duckdb` both keep their files in
    `x/STORE.parquet/`, and each would read, replace and sweep away the other's files. MARKER
    names the store file that owns the folder (older tracelab wrote the folder's stem, which
    names neither). A folder whose marker does not name `db_path` is refused while the other
    store file exists (a DuckDB file); with no such file the store was renamed with its folder,
    and a writer (`claim`) writes its own name into the marker."""
    if str(db_path) == ":memory:":
        return
    db = Path(os.path.abspath(db_path))
    root = parquet_root(db)
    try:
        owner = (root / MARKER).read_text().strip()
    except OSError:
        return  # no store folder yet (make_root marks it), or not ours to read
    if owner == db.name:
        return
    stem = root.name.removesuffix(FOLDER_SUFFIX)
    rival = db.with_name(stem if db.name != stem else stem + ".duckdb")
    if _is_duckdb_file(rival) and owner in (rival.name, stem):
        raise StoreError(
            f"{db}: its Parquet folder {root} holds the files of the store {rival} (a store "
            "file named with and without .duckdb maps to one folder, and each would replace "
            "and remove the other's files). Give this store another name (--db), or move "
            f"{rival} away with its folder."
        )
    if claim:
        (root / MARKER).write_text(db.name + "\n")


def enclosing_store_folder(path: str | os.PathLike[str]) -> Path | None:
    """The store folder (one marked MARKER) that `path` lies in, or None. Its store's next
    write sweeps away whatever it does not list there: a store or an export put inside was
    accepted, and deleted by the next ingest."""
    p = Path(os.path.abspath(path))
    return next((d for d in p.parents if (d / MARKER).is_file()), None)


def prepare_store_path(db_path: str | os.PathLike[str]) -> None:
    """Before an ingest converts anything: make sure `db_path` can be opened as a store once
    the conversions are done, rather than fail after them. The store's folder is created when
    missing (as `tracelab.profile` creates its capture folder); a path that is a folder or a
    file of another kind, a folder that cannot be created or written, and a store file whose
    Parquet folder another store owns (check_owner) are refused, naming the path."""
    if str(db_path) == ":memory:":
        return
    db = Path(db_path)
    inside = enclosing_store_folder(db)
    if inside is not None:
        raise StoreError(
            f"{db}: this is inside {inside}, another store's Parquet folder, which that store "
            "sweeps of every file it does not list. Give --db a path outside it."
        )
    if "?" in str(db.absolute().parent) or "?" in str(db.resolve().parent):
        # DuckDB names the write-ahead log by inserting ".wal" before the path's first "?":
        # every commit failed ("Cannot open file /x/q.wal?y/s.duckdb"), exit 70.
        raise StoreError(
            f"{db}: DuckDB cannot keep a store in a folder whose path holds '?' (it misnames "
            "the store's write-ahead log). Give --db a path without '?' in its folders."
        )
    if db.is_dir():
        raise StoreError(
            f"{db}: this is a folder, not a store file. Name a file in it: "
            f"--db {db / 'tracelab.duckdb'}."
        )
    if db.is_symlink() and not db.exists():
        raise StoreError(f"{db}: a symbolic link to a file that does not exist. Give --db a path.")
    if db.is_file() and not db.stat().st_size:
        # DuckDB refuses an empty file as "not a valid DuckDB database" (mktemp makes one)
        raise StoreError(
            f"{db}: the file is empty, not a store. Remove it (tracelab creates the store "
            "there), or give --db a new path."
        )
    if db.is_file() and not _is_duckdb_file(db):
        raise StoreError(
            f"{db}: this file is not a tracelab store (not a DuckDB database). Give --db a new "
            "path, or move the file away."
        )
    folder = db.absolute().parent
    blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise StoreError(f"{db}: {blocking} is a file, not a folder. Give --db another path.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"{db}: cannot create the store's folder {folder} ({exc.strerror or exc}). Create "
            "it, or give --db a path in a folder you can write."
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(
            f"{db}: the store's folder {folder} is not writable (the store file and its "
            "Parquet folder are written there). Give --db a path in a folder you can write."
        )
    check_owner(db, claim=False)


def make_root(con: duckdb.DuckDBPyConnection) -> Path:
    """The store folder, created (with MARKER naming the store file) when it does not exist
    yet. A store's opening checks that an existing folder is its own (check_owner)."""
    db = _db_file(con)
    if db is None:
        raise StoreError(
            "an in-memory store cannot hold a run's Parquet files. Use a store file (--db FILE)."
        )
    root = parquet_root(db)
    if (root / MARKER).is_file():
        return root
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise StoreError(
            f"{root}: this is where the store keeps its Parquet files, but something that is not "
            "a tracelab store folder is there. Move it away, or use another --db."
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(db.name + "\n")
    return root


def sql_paths(root: Path, paths: list[str]) -> str:
    """The files `paths` (inside `root`, '/'-separated) as a list of SQL string literals, for a
    view's file list. Joined as text: as Paths, 0.19 s of the 0.28 s it took at 10,000 files,
    under the write lock of every ingest's move."""
    base = str(root).rstrip("/") + "/"
    return ", ".join(sql_text(base + p) for p in paths)


def sql_text(text: str) -> str:
    """`text` as an SQL string literal (a view's file list takes no bind parameters)."""
    return "'" + text.replace("'", "''") + "'"


def view_over_listed(
    con: duckdb.DuckDBPyConnection, sql: str, root: Path | None, paths: list[str]
) -> None:
    """Create a view over the listed files `paths` (in `root`) with `sql`. DuckDB binds the
    first file as the view is created, so with that file removed from outside tracelab every
    later write (an ingest, a delete) failed as an internal error: now the StoreError of
    unreadable_files, naming the run to delete. (The others are read when a query reads them:
    tracelab.store.files.check_files_present.)"""
    names = dict(con.execute("SELECT run_id, name FROM runs").fetchall()) if paths else {}
    try:
        con.execute(sql)
    except duckdb.IOException as exc:
        if root is None or str(root) not in str(exc):
            raise
        raise unreadable_files(root, paths, names, exc) from None


def unreadable_files(
    root: Path, paths: list[str], names: dict[int, str], exc: Exception
) -> StoreError:
    """The error for a store whose listed files (`paths` in `root`) cannot all be read: those
    that are not there, with the runs they belong to (run_id -> name), and the way out."""
    missing = [p for p in paths if not (root / p).is_file()]
    if not missing:
        return StoreError(
            f"{root}: a file this store lists cannot be read ({exc}). The store folder was "
            "changed outside tracelab: put it back as it was, or ingest the run again into a "
            "new store."
        )
    ids = sorted({int(m.group(1)) for p in missing if (m := RUN_FOLDER.match(p.split("/")[0]))})
    runs = ", ".join(repr(names.get(i, f"id {i}")) for i in ids)
    more = f" and {len(missing) - 1:,} more" if len(missing) > 1 else ""
    return StoreError(
        f"{root}: {len(missing):,} of the files this store lists "
        f"{'is' if len(missing) == 1 else 'are'} not there ({missing[0]}{more}), of run "
        f"{runs}: removed or moved outside tracelab. Put {'it' if len(missing) == 1 else 'them'} back, or delete the run "
        "(`tracelab delete RUN` with this --db) and ingest it again."
    )


def listed(con: duckdb.DuckDBPyConnection, kind: str | None = None) -> list[str]:
    """The paths parquet_files lists (of one kind: 'events', 'time_parts'), in order."""
    sql = "SELECT path FROM parquet_files" + (" WHERE kind = ?" if kind else "")
    return [
        str(r[0]) for r in con.execute(sql + " ORDER BY path", [kind] if kind else []).fetchall()
    ]


def parts_select_sql(root: Path, paths: list[str]) -> str:
    """The rows of the time_parts files `paths` (inside `root`, at least one) as the
    `time_parts` view has them: the store's view (tracelab.derived.part_files) and a view
    query's read of one run's files (tracelab.store.files.run_parts_sql)."""
    return (
        "SELECT run_id, rank, step, start_ns, end_ns, part "
        f"FROM read_parquet([{sql_paths(root, paths)}])"
    )


def events_select_sql(root: Path, paths: list[str]) -> str:
    """The rows of the events files `paths` (inside `root`, at least one) as the `events` view
    has them: the store's view (tracelab.store.files) and a derivation worker's view of its
    batch's files (tracelab.derived.part_batches). The paths are written into the text (a view
    takes no bind parameters)."""
    files = sql_paths(root, paths)
    cols = ", ".join(
        f"idx + {_FROM_NAME.format(3, 'BIGINT')} AS idx"
        if c == "idx"
        else "CAST(args AS JSON) AS args"
        if c == "args"
        else c
        for c in EVENT_FILE_COLUMNS
    )
    return (
        f"SELECT {_FROM_NAME.format(1, 'INTEGER')} AS run_id, "
        f"{_FROM_NAME.format(2, 'INTEGER')} AS rank, {cols} "
        f"FROM read_parquet([{files}], filename = true, hive_partitioning = false)"
    )


def memory_select_sql(root: Path, paths: list[str]) -> str:
    """The rows of the trace memory files `paths` (inside `root`, at least one) as the `memory`
    view has them (tracelab.store.files.memory_view_sql), source 'trace'."""
    cols = ", ".join(
        f"TRY_CAST({column} AS INTEGER) AS {name}"
        if name in MEMORY_CASTS
        else f"{column} AS {name}"
        for name, column in MEMORY_FILE_COLUMNS.items()
    )
    return (
        f"SELECT {_FROM_NAME.format(1, 'INTEGER')} AS run_id, "
        f"{_FROM_NAME.format(2, 'INTEGER')} AS rank, 'trace' AS source, {cols}, "
        f"file_row_number + {_FROM_NAME.format(3, 'BIGINT')} AS idx "
        f"FROM read_parquet([{sql_paths(root, paths)}], filename = true, "
        "file_row_number = true, hive_partitioning = false)"
    )
