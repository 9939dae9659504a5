"""Export a run as Parquet: the format teams use when runs outgrow one machine.

An export folder holds MARKER, written first, so that a later `--overwrite` recognises the
folder as tracelab's own. Overwrite replaces only such a folder, and only when it holds nothing
but an export's files: never a folder holding the store, or any other file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import duckdb

from tracelab import __version__
from tracelab.errors import UsageError
from tracelab.store import resolve_run

#: The file that marks a folder as a tracelab export (JSON: run, tracelab version).
MARKER = ".tracelab-export"

#: Tables exported, and whether they are partitioned by rank.
EXPORT_TABLES = {
    "events": True, "steps": False, "ranks": False, "collectives": False,
    "memory": False, "lanes": False, "runs": False,
}


def export_run(
    con: duckdb.DuckDBPyConnection, run: str | None, out: str | os.PathLike[str], *, overwrite: bool = False
) -> dict[str, int]:
    """Write every table's rows of one run under `out`; returns rows written per table."""
    rid, name = resolve_run(con, run)
    root = Path(out)
    _clear(root, overwrite, _store_files(con))
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text(json.dumps({"run": name, "tracelab_version": __version__}))
    except OSError as exc:
        raise UsageError(f"{root}: cannot write the export here ({exc.strerror}). "
                         "Choose another --out.") from None
    written: dict[str, int] = {}
    for table, by_rank in EXPORT_TABLES.items():
        target = root / table if by_rank else root / f"{table}.parquet"
        opts = "FORMAT parquet, COMPRESSION zstd" + (", PARTITION_BY (rank)" if by_rank else "")
        # Table names come from the constant above; the run id and path are bound.
        # COPY takes no bind parameters: the table comes from the constant above, the run id
        # is an int, and the path is quoted.
        try:
            con.execute(
                f"COPY (SELECT * FROM {table} WHERE run_id = {int(rid)}) TO '{_quote(target)}' "
                f"({opts})"
            )
        except duckdb.IOException as exc:
            raise UsageError(f"{target}: cannot write the export ({exc}). Choose another "
                             "--out.") from None
        written[table] = int(
            con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [rid]).fetchone()[0]
        )
    return written


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _store_files(con: duckdb.DuckDBPyConnection) -> set[Path]:
    """The files of every database attached to `con` (the store, its WAL)."""
    out: set[Path] = set()
    for (path,) in con.execute("SELECT path FROM duckdb_databases() WHERE path IS NOT NULL"
                               ).fetchall():
        out.update({Path(path).resolve(), Path(path + ".wal").resolve()})
    return out


#: What an export folder may hold besides MARKER: a table's file, or events/rank=N/ folders.
_EXPORT_ENTRY = re.compile(r"^(?:\w+\.parquet|events)$")


def _is_export(root: Path) -> bool:
    if not (root / MARKER).is_file():
        return False
    for entry in root.iterdir():
        if entry.name == MARKER:
            continue
        if not _EXPORT_ENTRY.match(entry.name) or entry.is_symlink():
            return False
        if entry.is_dir():
            if entry.name != "events":
                return False
            for sub in entry.rglob("*"):
                if sub.is_symlink() or (sub.is_file() and not sub.name.endswith(".parquet")):
                    return False
    return True


def _clear(root: Path, overwrite: bool, store: set[Path]) -> None:
    """Make room for an export at `root`, replacing only a previous export of tracelab's own."""
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise UsageError(f"{root} exists and is not a folder. Choose another --out.")
    if not root.exists() or not any(root.iterdir()):
        return
    if not overwrite:
        raise UsageError(f"{root} exists and is not empty. Use --overwrite (it replaces only a "
                         "previous tracelab export) or another --out.")
    resolved = root.resolve()
    holds_store = any(resolved == f or resolved in f.parents for f in store)
    if holds_store or not _is_export(root):
        what = "holds the store" if holds_store else (
            f"is not a tracelab export (no {MARKER} file, or files an export does not write)")
        raise UsageError(f"{root} {what}: --overwrite replaces only a previous tracelab "
                         "export, never other files. Choose another --out.")
    shutil.rmtree(root)
