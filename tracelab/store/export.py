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
from tracelab.derived import TABLES as DERIVED_TABLES
from tracelab.errors import UsageError
from tracelab.store import resolve_run
from tracelab.store_folder import enclosing_store_folder

#: The file that marks a folder as a tracelab export (JSON: run, tracelab version).
MARKER = ".tracelab-export"

#: Tables exported, and whether they are partitioned by rank (events: the store's own files,
#: copied): the base tables, then the derived ones (docs/metrics.md; time_parts from its files,
#: through its view), so that the lost-time model can be queried where the export goes.
EXPORT_TABLES = {
    "events": True,
    "steps": False,
    "ranks": False,
    "process_group_configs": False,
    "collectives": False,
    "memory": False,
    "lanes": False,
    "hang_verdicts": False,
    "runs": False,
    **dict.fromkeys(DERIVED_TABLES, False),
}


def export_run(
    con: duckdb.DuckDBPyConnection,
    run: str | None,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> dict[str, int]:
    """Write every table's rows of one run under `out`; returns rows written per table."""
    rid, name = resolve_run(con, run)
    root = Path(out)
    inside = enclosing_store_folder(root)
    if inside is not None:
        raise UsageError(
            f"{root}: this is inside {inside}, a store's Parquet folder, whose store removes "
            "every file it does not list on its next write. Choose an --out outside it."
        )
    _clear(root, overwrite, _store_files(con))
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text(json.dumps({"run": name, "tracelab_version": __version__}))
    except OSError as exc:
        raise UsageError(
            f"{root}: cannot write the export here ({exc.strerror}). Choose another --out."
        ) from None
    written: dict[str, int] = {"events": _copy_events(con, rid, root / "events")}
    for table, by_rank in EXPORT_TABLES.items():
        if table == "events":
            continue
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
            raise UsageError(
                f"{target}: cannot write the export ({exc}). Choose another --out."
            ) from None
        written[table] = int(
            con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [rid]).fetchall()[0][0]
        )
    return written


def _copy_events(con: duckdb.DuckDBPyConnection, rid: int, target: Path) -> int:
    """The run's events files, copied from the store folder as they are (tracelab.store.files):
    `events/rank=R/events-OFFSET.parquet`, the run's id and rank in the path rather than in the
    rows, OFFSET added to `idx` as in the store. Returns the events copied."""
    from tracelab.store.files import store_root

    root = store_root(con)
    listed = con.execute(
        "SELECT path, row_count FROM parquet_files WHERE run_id = ? AND kind = 'events' "
        "ORDER BY rank, path",
        [rid],
    ).fetchall()
    count = 0
    for path, rows in listed:
        rel = Path(str(path))
        out = target / rel.parent.name / rel.name  # rank=R/events-OFFSET.parquet
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(str(root)) / rel, out)
        except OSError as exc:
            raise UsageError(
                f"{out}: cannot write the export ({exc.strerror}). Choose another --out."
            ) from None
        count += int(rows)
    return count


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _store_files(con: duckdb.DuckDBPyConnection) -> set[Path]:
    """The files of every database attached to `con` (the store, its WAL)."""
    out: set[Path] = set()
    for (path,) in con.execute(
        "SELECT path FROM duckdb_databases() WHERE path IS NOT NULL"
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
        raise UsageError(
            f"{root} exists and is not empty. Use --overwrite (it replaces only a "
            "previous tracelab export) or another --out."
        )
    resolved = root.resolve()
    holds_store = any(resolved == f or resolved in f.parents for f in store)
    if holds_store or not _is_export(root):
        what = (
            "holds the store"
            if holds_store
            else (f"is not a tracelab export (no {MARKER} file, or files an export does not write)")
        )
        raise UsageError(
            f"{root} {what}: --overwrite replaces only a previous tracelab "
            "export, never other files. Choose another --out."
        )
    shutil.rmtree(root)


# --- Perfetto / Chrome trace -----------------------------------------------------------------

#: Thread id of each rank's "where the time went" track (the lost-time model, time_parts).
PARTS_TID = 0
#: Device streams get thread ids from here on, apart from host threads.
_STREAM_TID = 1 << 40

_PERFETTO_EVENTS = """
SELECT json_object(
    'name', e.name, 'cat', coalesce(e.cat, e.category), 'ph', 'X',
    'ts', round((e.ts_ns - coalesce(o.offset_ns, 0) - $origin) / 1000.0, 3),
    'dur', round(e.dur_ns / 1000.0, 3), 'pid', e.rank,
    'tid', CASE WHEN e.on_device THEN $stream_tid + coalesce(e.pid, 0) * 1000000
                                      + coalesce(e.stream, e.tid, 0)
                ELSE coalesce(e.tid, hash(e.lane_label) % 1000000 + 1) END,
    'args', CASE WHEN e.args IS NULL THEN json_object()
                 ELSE json_merge_patch(json_object(), e.args) END)
FROM events e LEFT JOIN clock_offsets o ON o.run_id = e.run_id AND o.rank = e.rank
WHERE e.run_id = $run
ORDER BY e.rank, e.ts_ns
"""

_PERFETTO_PARTS = """
SELECT json_object('name', part, 'cat', 'tracelab.lost_time', 'ph', 'X',
                   'ts', round((start_ns - $origin) / 1000.0, 3),
                   'dur', round((end_ns - start_ns) / 1000.0, 3), 'pid', rank,
                   'tid', $parts_tid, 'args', json_object('step', step))
FROM time_parts WHERE run_id = $run ORDER BY rank, start_ns
"""

_PERFETTO_THREADS = """
SELECT DISTINCT e.rank, e.on_device,
       CASE WHEN e.on_device THEN $stream_tid + coalesce(e.pid, 0) * 1000000
                                  + coalesce(e.stream, e.tid, 0)
            ELSE coalesce(e.tid, hash(e.lane_label) % 1000000 + 1) END AS tid,
       e.pid, coalesce(e.stream, e.tid) AS stream, e.lane_label
FROM events e WHERE e.run_id = $run
"""


def export_perfetto(
    con: duckdb.DuckDBPyConnection,
    run: str | None,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> dict[str, int]:
    """Write one run as a single Chrome-trace JSON file that Perfetto's UI (and
    chrome://tracing) opens: one process per rank, every rank's events on the reference clock
    (its clock_offsets.offset_ns removed, so ranks line up), times in µs from the run's first
    event, plus per rank a "where the time went" track (time_parts). A `.gz` name writes gzip.
    Returns the number of events written, by kind."""
    import gzip
    import json

    rid, name = resolve_run(con, run)
    path = Path(out)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} exists. Use --overwrite or another --out.")
    if path.exists() and path.is_dir():
        raise UsageError(f"{path} is a folder; give a file name for the Perfetto trace.")
    row = con.execute(
        "SELECT min(e.ts_ns - coalesce(o.offset_ns, 0)) FROM events e LEFT JOIN clock_offsets o "
        "ON o.run_id = e.run_id AND o.rank = e.rank WHERE e.run_id = ?",
        [rid],
    ).fetchone()
    origin = int(row[0]) if row and row[0] is not None else 0
    params = {"run": rid, "origin": origin, "stream_tid": _STREAM_TID}
    offsets = dict(
        con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE run_id = ?", [rid]).fetchall()
    )
    meta = _perfetto_metadata(con, rid)
    counts = {"events": 0, "time_parts": 0}
    tmp = path.with_name(path.name + ".partial")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(tmp, "wt", encoding="utf-8") as fh:  # type: ignore[operator]
        fh.write('{"displayTimeUnit": "ms", "otherData": ')
        fh.write(
            json.dumps(
                {
                    "tracelab_run": name,
                    "clock": "reference rank's clock, offsets "
                    "from clock_offsets applied; ts in us since the run's first event",
                    "origin_ns": origin,
                    "offsets_ns": {str(k): int(v) for k, v in offsets.items()},
                }
            )
        )
        fh.write(', "traceEvents": [\n')
        first = True
        for m in meta:
            fh.write(("" if first else ",\n") + json.dumps(m))
            first = False
        for key, sql in (("time_parts", _PERFETTO_PARTS), ("events", _PERFETTO_EVENTS)):
            used = {k: v for k, v in {**params, "parts_tid": PARTS_TID}.items() if f"${k}" in sql}
            cur = con.execute(sql, used)
            while True:
                chunk = cur.fetchmany(50_000)
                if not chunk:
                    break
                fh.write(("" if first else ",\n") + ",\n".join(r[0] for r in chunk))
                first = False
                counts[key] += len(chunk)
        fh.write("\n]}\n")
    tmp.replace(path)
    return counts


def _perfetto_metadata(con: duckdb.DuckDBPyConnection, rid: int) -> list[dict[str, object]]:
    """The Perfetto trace's `M` events: a process per rank (named by its host), a
    where-the-time-went track per rank, and a name for every thread and device stream."""
    names = {
        (int(r), int(p) if p is not None else None, int(t) if t is not None else None): v
        for r, p, t, v in con.execute(
            "SELECT rank, pid, tid, any_value(value) FROM lanes WHERE run_id = ? AND "
            "kind = 'thread_name' GROUP BY ALL",
            [rid],
        ).fetchall()
    }
    hosts = dict(con.execute("SELECT rank, host FROM ranks WHERE run_id = ?", [rid]).fetchall())
    meta: list[dict[str, object]] = []
    for rank in sorted(hosts):
        label = f"rank {rank}" + (f" ({hosts[rank]})" if hosts[rank] else "")
        meta += [
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": label}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}},
            {
                "name": "thread_name",
                "ph": "M",
                "pid": rank,
                "tid": PARTS_TID,
                "args": {"name": "where the time went (tracelab lost-time model)"},
            },
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": rank,
                "tid": PARTS_TID,
                "args": {"sort_index": -1},
            },
        ]
    for rank, on_dev, tid, pid, stream, label in con.execute(
        _PERFETTO_THREADS, {"run": rid, "stream_tid": _STREAM_TID}
    ).fetchall():
        if on_dev:
            tname = f"device {pid} stream {stream}"
        else:
            tname = label or names.get((int(rank), pid, stream)) or f"thread {stream}"
        meta.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": int(rank),
                "tid": int(tid),
                "args": {"name": str(tname)},
            }
        )
    return meta
