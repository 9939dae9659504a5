"""Loading a capture's own records: the collector's collective timings and memory peaks.

Shapes are those of docs/capture-format.md. Records are validated line by line; a malformed
record is an input error naming the file and line, like a malformed trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracelab.derived.sqlfiles import insert_rows
from tracelab.errors import InputError
from tracelab.ingest import validate as v
from tracelab.ingest.discover import Capture, capture_path

if TYPE_CHECKING:
    import duckdb

_COLLECTIVE_FIELDS = (
    "source",
    "op",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "group_size",
    "seq",
    "in_bytes",
    "out_bytes",
    "dtype",
    "peer",
    "enqueue_ns",
    "start_ns",
    "end_ns",
    "step",
    "in_split_bytes",
    "out_split_bytes",
)
#: The columns of memory_peaks (the `memory` view's step peaks), in the order of the rows built
#: here.
_MEMORY_COLUMNS = (
    "run_id",
    "rank",
    "source",
    "ts_ns",
    "step",
    "device_type",
    "device_id",
    "delta_bytes",
    "allocated_bytes",
    "reserved_bytes",
)
_SOURCES = ("collector", "flight_recorder")
#: What each field of a collective record may hold (tracelab.ingest.validate).
RECORD_FIELDS = {
    "op": v.TEXT,
    "source": v.TEXT,
    "pg_name": v.TEXT,
    "pg_desc": v.TEXT,
    "pg_ranks": ("ints", 0, v.INT32_MAX - 1),
    "group_size": ("int", 0, v.INT32_MAX),
    "seq": v.INT64,
    "in_bytes": v.SIZE,
    "out_bytes": v.SIZE,
    "in_split_bytes": ("ints", 0, v.INT64_MAX),
    "out_split_bytes": ("ints", 0, v.INT64_MAX),
    "dtype": v.TEXT,
    "peer": v.RANK_ID,
    "enqueue_ns": v.TIME,
    "start_ns": v.TIME,
    "end_ns": v.TIME,
    "step": v.STEP,
    "window": v.INT32,
}


def read_collectives(path: Path) -> list[dict[str, Any]]:
    """Parse a collectives.jsonl file; every line must be one JSON object with an op."""
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise InputError(f"unreadable collective records ({exc.strerror}).", str(path)) from None
    if lines and lines[0].startswith(v.BOM):
        lines[0] = lines[0][len(v.BOM) :]
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = v.decode_json(line, path, f"collective record on line {n}")
        except InputError:
            if n == len(lines) and not line.endswith(b"}"):
                break  # a last line cut off by a crash: keep everything before it
            raise
        if not isinstance(rec, dict) or not isinstance(rec.get("op"), str):
            raise InputError(f"line {n} is not a collective record (needs 'op').", str(path))
        if rec.get("source", "collector") not in _SOURCES:
            raise InputError(f"line {n}: unknown source {rec.get('source')!r}.", str(path))
        v.fields(rec, RECORD_FIELDS, f"line {n}", path)
        rows.append(rec)
    return rows


def check_capture_records(capture: Capture, ranks: set[int]) -> dict[int, InputError]:
    """Read every collectives.jsonl of `ranks` before anything is written: rank -> the error
    of its records file, for the ranks whose file is bad."""
    bad: dict[int, InputError] = {}
    for rank in sorted(ranks):
        rel = capture.ranks.get(rank, {}).get("collectives")
        if not rel:
            continue
        try:
            path = capture_path(capture, rel, f"rank {rank}'s collectives")
            if path.is_file():
                read_collectives(path)
        except InputError as exc:
            bad[rank] = exc
    return bad


def load_capture_records(
    con: duckdb.DuckDBPyConnection, run_id: int, capture: Capture, ranks: set[int]
) -> None:
    """Insert the collector's collective records and per-step memory peaks of `ranks`."""
    coll_rows: list[list[Any]] = []
    mem_rows: list[list[Any]] = []
    # A named group's rank list is kept on its first record of the run only, as for a trace's
    # kernels (tracelab.ingest.load.load_trace_collectives): captures of collectors before 2026-12
    # repeat it on every line, and a 10,000-rank group's list per call and rank would be
    # ranks x calls x group size.
    listed: set[str] = set()
    for rank in sorted(ranks):
        entry = capture.ranks.get(rank, {})
        rel = entry.get("collectives")
        if rel:
            path = capture_path(capture, rel, f"rank {rank}'s collectives")
            if path.is_file():
                for rec in read_collectives(path):
                    values = [rec.get(k) for k in _COLLECTIVE_FIELDS]
                    values[0] = values[0] or "collector"
                    name = rec.get("pg_name")
                    if values[4] is not None and name is not None and name in listed:
                        values[4] = None
                    elif values[4] is not None:
                        if name is not None and values[4]:
                            listed.add(name)
                        values[4] = json.dumps(values[4])
                    if rec["op"] != "all_to_all":  # split lists describe all-to-alls only
                        values[-2:] = [None, None]
                    coll_rows.append([run_id, rank, *values])
        for peak in entry.get("memory") or []:
            device_type = 1 if str(peak.get("device_type", "cpu")).startswith("cuda") else 0
            allocated = peak.get("peak_allocated_bytes")
            if allocated is None:
                allocated = peak.get("rss_bytes")
            mem_rows.append(
                [
                    run_id,
                    rank,
                    "step_peak",
                    int(peak.get("ts_ns") or 0),
                    peak.get("step"),
                    device_type,
                    peak.get("device_id"),
                    None,
                    allocated,
                    peak.get("peak_reserved_bytes"),
                ]
            )
    insert_rows(con, "collectives", ("run_id", "rank", *_COLLECTIVE_FIELDS), coll_rows)
    insert_rows(con, "memory_peaks", _MEMORY_COLUMNS, mem_rows)
