"""The store's Parquet folder: where each run's per-rank event and memory files live, the
`events` and `memory` views over the files the catalog lists, and the removal of every file it
does not list.

Layout: the store `STORE.duckdb` keeps its Parquet files in `STORE.parquet/` beside it (a store
file named without `.duckdb` gets `NAME.parquet/`), one folder per run and rank, hive-style:
`run=ID/rank=R/events-OFFSET.parquet`, where OFFSET is the number of the rank's events in its
earlier profiling windows (0 for the first), added to the file's own `idx`; beside it the
window's [memory] instants, `memory-OFFSET.parquet` (OFFSET counting the rank's earlier
instants). The folder holds MARKER, so that tracelab never takes a folder of the user's own
for its store folder.

The rules that make the layout safe against kills and concurrent processes:

- a file is listed in `parquet_files` only in the transaction that commits its run, after it is
  whole and in place (an ingest moves a run's finished folder into place with one rename), and
  `events` is replaced in that transaction, so a reader sees a run whole or not at all;
- the folder is changed only by a process holding the store's write lock (open_store with
  read_only=False), and such a process removes every file the catalog does not list when it
  opens and closes the store (sweep): what a killed ingest left, and a deleted run's files.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import duckdb

from tracelab.derived.sqlfiles import insert_rows
from tracelab.errors import StoreError
from tracelab.store.versions import first_row
from tracelab.store_folder import EVENT_FILE_COLUMNS as EVENT_FILE_COLUMNS  # re-exported
from tracelab.store_folder import FOLDER_SUFFIX as FOLDER_SUFFIX  # re-exported
from tracelab.store_folder import MARKER as MARKER
from tracelab.store_folder import (
    PARQUET_FILES_COLUMNS,
    RUN_FOLDER,
    events_select_sql,
    listed,
    memory_select_sql,
    parts_select_sql,
    run_folder,
    unreadable_files,
    view_over_listed,
)
from tracelab.store_folder import make_root as make_root
from tracelab.store_folder import parquet_root as parquet_root
from tracelab.store_folder import store_root as store_root

#: The kinds of file parquet_files lists per rank that stay files, each read through the view
#: of its name (the derived time_parts: tracelab.derived.part_files).
FILE_KINDS = ("events", "memory")


def rank_file(run_id: int, rank: int, kind: str, offset: int) -> str:
    """Where one file of a rank (FILE_KINDS: a window's events, or its [memory] instants, beside
    them) lives inside the store folder ('/'-separated): OFFSET is the number of the rank's
    events (memory instants) in its earlier windows, added to each row's position (idx)."""
    return f"{run_folder(run_id)}/{rank_file_name(rank, kind, offset)}"


def run_rank_file(folder: Path, rank: int, kind: str, offset: int) -> Path:
    """Where one file of a rank lives in a run's folder `folder` (`run=ID/`: the store's, or a
    staged store's before the run is moved in)."""
    return folder / rank_file_name(rank, kind, offset)


def rank_file_name(rank: int, kind: str, offset: int) -> str:
    """rank_file's path inside the run's folder."""
    return f"rank={int(rank)}/{kind}-{int(offset)}.parquet"


#: The `memory` view's rows of memory_peaks (tables.sql's form of the view without files).
_PEAKS_SELECT = "SELECT *, CAST(NULL AS BIGINT) AS idx FROM memory_peaks"


def _empty_view_sql(view: str) -> str:
    """The view's form without files in tables.sql (a store's first)."""
    text = resources.files("tracelab").joinpath("store/schema/tables.sql").read_text()
    found = re.search(rf"^CREATE OR REPLACE VIEW {view} AS .*?;$", text, re.M | re.S)
    assert found is not None, f"tables.sql defines the {view} view"
    return found.group(0)


def file_view_sql(view: str, root: Path, paths: list[str], *, temp: bool = False) -> str:
    """The view `view` (FILE_KINDS: `events`, or `memory`, whose collector peaks are a table's
    rows) over the files `paths` (inside `root`). The paths are written into the view's text (a
    view takes no bind parameters); they are the catalog's own, quoted."""
    create = f"CREATE OR REPLACE {'TEMP ' if temp else ''}VIEW {view} AS"
    if not paths:
        return _empty_view_sql(view).replace(f"CREATE OR REPLACE VIEW {view} AS", create, 1)
    if view == "memory":
        return f"{create} {_PEAKS_SELECT} UNION ALL {memory_select_sql(root, paths)}"
    return f"{create} {events_select_sql(root, paths)}"


def rank_events_sql(con: duckdb.DuckDBPyConnection, run_id: int, ranks: Sequence[int]) -> str:
    """A subquery of the events of a few ranks of a run, as the `events` view has them, that
    reads those ranks' files only. The view names every file of the store, and any query on it
    binds that whole list: at 10,000 ranks 0.84 s for one rank's 51 events, 3 ms from the
    rank's own file. For a bounded set of ranks; a query over every rank reads `events`."""
    root = store_root(con)
    paths = _run_files(con, run_id, "events", ranks)
    if root is None or not paths:
        return "(SELECT * FROM events WHERE false)"
    return f"({events_select_sql(root, paths)})"


def run_parts_sql(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """A subquery of the run's rows of the `time_parts` view that reads the run's own files
    (tracelab.derived.part_files): the view names every run's files, and a query on it binds
    them all."""
    root = store_root(con)
    paths = _run_files(con, run_id, "time_parts")
    if root is None or not paths:
        return "(SELECT * FROM time_parts WHERE false)"
    return f"({parts_select_sql(root, paths)})"


def run_memory_sql(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """A subquery of the run's rows of the `memory` view that reads the run's own memory files
    and step peaks: the view names every run's files, and a query on it binds them all (0.19 s
    against 0.001 s for one rank's instants at 2,000 one-row files)."""
    root = store_root(con)
    paths = _run_files(con, run_id, "memory")
    peaks = f"{_PEAKS_SELECT} WHERE run_id = {int(run_id)}"
    if root is None or not paths:
        return f"({peaks})"
    return f"({peaks} UNION ALL {memory_select_sql(root, paths)})"


def _run_files(
    con: duckdb.DuckDBPyConnection, run_id: int, kind: str, ranks: Sequence[int] | None = None
) -> list[str]:
    """The paths parquet_files lists for the run, of one kind, of the ranks `ranks` (a
    time_parts file is listed under its batch's first rank: every rank when None)."""
    sql = "SELECT path FROM parquet_files WHERE run_id = $run AND kind = $kind"
    params: dict[str, object] = {"run": int(run_id), "kind": kind}
    if ranks is not None:
        sql += " AND list_contains($ranks, rank)"
        params["ranks"] = [int(r) for r in ranks]
    return [str(p) for (p,) in con.execute(sql + " ORDER BY path", params).fetchall()]


def refresh_file_views(
    con: duckdb.DuckDBPyConnection, *, temp: bool = False, kinds: Sequence[str] = FILE_KINDS
) -> None:
    """Make `events` and `memory` (of `kinds`) the views over the files of their kind the
    catalog lists now (in the caller's transaction), with their column comments, and record
    the folder the views read."""
    from tracelab.store.schema import apply_view_comments

    root = store_root(con)
    for kind in kinds:
        paths = listed(con, kind) if root else []
        view_over_listed(con, file_view_sql(kind, root or Path("."), paths, temp=temp), root, paths)
        if not temp:
            apply_view_comments(con, kind)
    if temp:
        return
    con.execute(
        "INSERT OR REPLACE INTO tracelab_meta VALUES ('parquet_root', ?)", [str(root or "")]
    )


def check_files_present(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a store whose folder lacks a file the catalog lists (unreadable_files), before
    work that reads every run: DuckDB binds only the first file of a view as it is created,
    and reads the others when a query does, so a rederive recorded the missing file of one
    run as a failed component of every other run it derived."""
    root = store_root(con)
    paths = listed(con) if root is not None else []
    if root is None or all((root / p).is_file() for p in paths):
        return
    names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
    raise unreadable_files(root, paths, names, FileNotFoundError("a listed file is gone"))


def follow_moved_store(con: duckdb.DuckDBPyConnection, *, read_only: bool) -> None:
    """A store moved with its folder: point `events` at where the folder is now (a temporary
    view for a reader, which cannot change the store; the stored view for a writer)."""
    root = store_root(con)
    if root is not None and not (root / MARKER).is_file():
        listed = first_row(con.execute("SELECT count(*) FROM parquet_files"))
        if listed and listed[0]:
            raise StoreError(
                f"{root}: this store's Parquet folder is missing (the store file lists "
                f"{listed[0]} files in it). A store is its file and this folder beside it: "
                "copy or move both together."
            )
    row = first_row(con.execute("SELECT value FROM tracelab_meta WHERE key = 'parquet_root'"))
    if root is None or row is None or row[0] in ("", str(root)):
        return
    from tracelab.derived import part_files

    refresh_file_views(con, temp=read_only)
    part_files.refresh_view(con, temp=read_only)


def place_run(con: duckdb.DuckDBPyConnection, staged_folder: Path, run_id: int) -> Path:
    """Move a run's folder (a staged store's `run=ID/`, tracelab.store.staged) into the store
    folder as `run=ID`, with one rename: a kill leaves it whole or not there. Across file
    systems (a store folder that is a link to another) it is copied beside, then renamed: every
    file copied while the caller holds the write lock. Call holding the write lock, before the
    transaction that lists its files."""
    root = make_root(con)
    target = root / run_folder(run_id)
    if target.exists():  # never listed (each id is handed out once): an unlisted leftover
        shutil.rmtree(target)
    try:
        os.rename(staged_folder, target)
    except OSError:  # another file system: copy beside, then rename
        partial = root / f".{run_folder(run_id)}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(staged_folder, partial)
        os.rename(partial, target)
    return target


def register_files(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    files: list[tuple[int, int, int]],
    memory: Sequence[tuple[int, int, int]] = (),
    *,
    refresh: bool = True,
) -> None:
    """List a run's events files and trace memory files, (rank, offset, rows) each, in the
    run's folder in this store's folder, and replace the views (unless `refresh` is false:
    the caller replaces them, refresh_file_views); in the caller's transaction, so that they
    become visible when it commits (an ingest lists them in its staged store, whose rows the
    move copies: tracelab.store.staged)."""
    root = make_root(con)
    rows = []
    for kind, listed_files in zip(FILE_KINDS, (files, memory), strict=True):
        for rank, offset, count in listed_files:
            path = rank_file(run_id, rank, kind, offset)
            rows.append([run_id, rank, kind, path, count, (root / path).stat().st_size])
    insert_rows(con, "parquet_files", PARQUET_FILES_COLUMNS, rows)
    if refresh:
        refresh_file_views(con)


def sweep(con: duckdb.DuckDBPyConnection) -> list[Path]:
    """Remove every file of the store folder that the catalog does not list: what a killed
    ingest placed, and the files of deleted runs. Only a process that holds the write lock
    calls this, outside a transaction.

    It reads the folder by its layout rather than walking every file: a run folder (`run=ID`)
    of no listed file goes whole; in a run that has files, only the rank folders and `parts/`
    files it does not list go, and its rank folders are not opened (their files are listed
    together, in the transaction that lists the run). The walk took a median 9.45 s for a store of 10
    runs of 10,000 ranks, held under the write lock at each writer's open and close
    (benchmarks/sweep.py)."""
    root = store_root(con)
    if root is None or not (root / MARKER).is_file():
        return []
    by_run: dict[int, set[str]] = {}
    for run_id, path in con.execute("SELECT run_id, path FROM parquet_files").fetchall():
        by_run.setdefault(int(run_id), set()).add(str(path))
    removed: list[Path] = []
    for entry in _entries(root):
        found = RUN_FOLDER.fullmatch(entry.name)
        if entry.name == MARKER:
            continue
        if found and entry.is_dir(follow_symlinks=False) and int(found.group(1)) in by_run:
            removed += _sweep_run(root, entry.name, by_run[int(found.group(1))])
        else:
            removed += _remove(Path(entry.path))
    return removed


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _sweep_run(root: Path, run: str, kept: set[str]) -> list[Path]:
    """The unlisted entries of one listed run's folder: rank folders it lists no file of,
    `parts/` files it does not list, and anything else."""
    ranks = {p.split("/", 2)[1] for p in kept if p.count("/") == 2}
    removed: list[Path] = []
    for entry in _entries(root / run):
        if entry.name == "parts" and entry.is_dir(follow_symlinks=False):
            for part in _entries(Path(entry.path)):
                if f"{run}/parts/{part.name}" not in kept:
                    removed += _remove(Path(part.path))
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)  # (when empty)
        elif entry.name not in ranks or not entry.is_dir(follow_symlinks=False):
            removed += _remove(Path(entry.path))
    return removed


def _remove(path: Path) -> list[Path]:
    """Remove a file or a folder whole; the files removed."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            files = [p for p in path.rglob("*") if not p.is_dir() or p.is_symlink()]
            shutil.rmtree(path, ignore_errors=True)
            return files
        path.unlink()
        return [path]
    return []
