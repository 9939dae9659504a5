"""Export a run as Parquet: the format teams use when runs outgrow one machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from tracelab.errors import UsageError
from tracelab.store import resolve_run

#: Tables exported, and whether they are partitioned by rank.
EXPORT_TABLES = {
    "events": True, "steps": False, "ranks": False, "collectives": False,
    "memory": False, "lanes": False, "runs": False,
}


def export_run(
    con: duckdb.DuckDBPyConnection, run: str | None, out: str | os.PathLike[str], *, overwrite: bool = False
) -> dict[str, int]:
    """Write every table's rows of one run under `out`; returns rows written per table."""
    rid, _ = resolve_run(con, run)
    root = Path(out)
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise UsageError(f"{root} exists and is not empty. Use --overwrite or another --out.")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    for table, by_rank in EXPORT_TABLES.items():
        target = root / table if by_rank else root / f"{table}.parquet"
        opts = "FORMAT parquet, COMPRESSION zstd" + (", PARTITION_BY (rank)" if by_rank else "")
        # Table names come from the constant above; the run id and path are bound.
        # COPY takes no bind parameters: the table comes from the constant above, the run id
        # is an int, and the path is quoted.
        con.execute(
            f"COPY (SELECT * FROM {table} WHERE run_id = {int(rid)}) TO '{_quote(target)}' ({opts})"
        )
        written[table] = int(
            con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [rid]).fetchone()[0]
        )
    return written


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
