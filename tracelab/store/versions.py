"""The store's versions: its schema version, the derived layer's version, and the DuckDB storage
format it was written in. A store of another version is refused with the command that fixes it."""

from __future__ import annotations

import functools
import os
import re
import tempfile

import duckdb

from tracelab.errors import StoreError

#: 7: the trace's [memory] instants are Parquet files beside the events (they grow with the
#: events), the collector's step peaks a table (memory_peaks), `memory` a view over both.
#: 6: each run's distinct process-group configurations once (process_group_configs), each rank
#: naming its own (ranks.process_groups_config), in place of a copy per rank. 5: collectives
#: keep an all-to-all's per-peer bytes from the collector's record (in_split_bytes,
#: out_split_bytes). 4: events are Parquet files in the store folder, `events` a view over them
#: (3: a table, with hang_verdicts; 2: a table, no hang_verdicts).
#: `tracelab migrate` takes 2 to 6 to 7.
SCHEMA_VERSION = 7
#: Version of what tracelab.derived computes into the derived tables. Bumped whenever a
#: definition changes, so that a store derived by an older tracelab is re-derived
#: (`tracelab rederive`) rather than shown with numbers that no longer mean the same.
#: 8: the last rank of a matched collective waits for no one (its wait_ns and linked waits are
#: its transfer in the parts, not a wait for itself).
DERIVED_VERSION = 8


def first_row(cur: duckdb.DuckDBPyConnection) -> tuple | None:
    """The first row of a result, read through: DuckDB 2 refuses the connection's next
    relational query while a result is unread (fetchone leaves it so)."""
    rows = cur.fetchall()
    return rows[0] if rows else None


def check_version(con: duckdb.DuckDBPyConnection, path: str, check_derived: bool = True) -> None:
    try:
        row = first_row(con.execute("SELECT value FROM tracelab_meta WHERE key = 'schema_version'"))
    except duckdb.CatalogException as exc:
        raise StoreError(
            f"{path}: this DuckDB file is not a tracelab store (no tracelab_meta table). "
            "Point --db at a tracelab store or at a new file."
        ) from exc
    found = int(row[0]) if row else None
    if found in (2, 3):
        raise StoreError(
            f"{path}: store schema version {found} (events inside the DuckDB file); this tracelab "
            f"reads version {SCHEMA_VERSION} (events as Parquet files beside it). Migrate it in "
            f"place, keeping every run: tracelab migrate --db {path}"
        )
    if found in (4, 5, 6):
        was = {
            4: "collectives without the all-to-all's per-peer bytes",
            5: "a copy of the process-group configuration per rank",
            6: "the trace's memory instants inside the DuckDB file",
        }[found]
        raise StoreError(
            f"{path}: store schema version {found} ({was}); this tracelab reads version "
            f"{SCHEMA_VERSION}. Migrate it in place, keeping every run: tracelab migrate --db {path}"
        )
    if found is not None and found > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema version {found}, written by a newer tracelab; this one reads "
            f"version {SCHEMA_VERSION}. Upgrade tracelab (pip install -U tracelab) to read it, "
            "or ingest the traces into a new store (--db NEW.duckdb)."
        )
    if found != SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema version {found} but this tracelab reads version "
            f"{SCHEMA_VERSION}. Re-ingest the traces into a new store (--db NEW.duckdb)."
        )
    if check_derived:
        derived = stored_derived_version(con)
        if derived is None:
            raise StoreError(
                f"{path}: the store's derived tables were being recomputed when that stopped "
                f"(some runs have none). Finish it, keeping every event: tracelab rederive "
                f"--db {path}"
            )
        if derived != DERIVED_VERSION:
            raise StoreError(
                f"{path}: the store's derived tables were computed by another tracelab "
                f"(derived version {derived}; this one computes version {DERIVED_VERSION}). "
                f"Recompute them, keeping every event: tracelab rederive --db {path}"
            )


def stored_derived_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The derived version the store's derived tables were computed with."""
    row = first_row(con.execute("SELECT value FROM tracelab_meta WHERE key = 'derived_version'"))
    return int(row[0]) if row else None


# The DuckDB file format. DuckDB 2.0 writes files that 1.x cannot read, and a newer DuckDB may
# write data into an older store that its writer can no longer read. So the store records the
# storage version (and the DuckDB release) that created it beside the schema version, and a
# DuckDB that writes another storage version is refused with both versions named.


def duckdb_storage_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The storage version of the connection's database file as DuckDB names it ('v2.0.0+');
    None for an in-memory database."""
    row = first_row(
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


def record_duckdb_storage(con: duckdb.DuckDBPyConnection) -> None:
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


def check_duckdb_storage(con: duckdb.DuckDBPyConnection, path: str) -> None:
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


def unopenable_store_error(path: str, exc: Exception) -> StoreError:
    """A StoreError for a file DuckDB refused; it names both DuckDB versions when the file's
    storage version is the reason."""
    text = str(exc)
    if "not a valid DuckDB database file" in text:
        return StoreError(
            f"{path}: this file is not a tracelab store (not a DuckDB database). Check --db, or "
            "give a new path to make a store there."
        )
    if "Permission denied" in text:
        return StoreError(
            f"{path}: cannot open the store: permission denied. A command that changes the store "
            "needs to write the file and the folder beside it; read it as its owner, or copy the "
            "store with its folder somewhere you can write."
        )
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
