"""Loading a capture's own records: the collector's collective timings and memory peaks.

Shapes are those of docs/capture-format.md. Records are validated line by line; a malformed
record is an input error naming the file and line, like a malformed trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracelab.discover import Capture
from tracelab.errors import InputError

if TYPE_CHECKING:
    import duckdb

_COLLECTIVE_FIELDS = (
    "source", "op", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq", "in_bytes",
    "out_bytes", "dtype", "peer", "enqueue_ns", "start_ns", "end_ns", "step",
)
_SOURCES = ("collector", "flight_recorder")


def read_collectives(path: Path) -> list[dict[str, Any]]:
    """Parse a collectives.jsonl file; every line must be one JSON object with an op."""
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"unreadable collective records ({exc}).", str(path)) from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            if n == len(lines):
                break  # a last line cut off by a crash: keep everything before it
            raise InputError(f"line {n} is not JSON ({exc}).", str(path)) from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("op"), str):
            raise InputError(f"line {n} is not a collective record (needs 'op').", str(path))
        if rec.get("source", "collector") not in _SOURCES:
            raise InputError(f"line {n}: unknown source {rec.get('source')!r}.", str(path))
        rows.append(rec)
    return rows


def load_capture_records(
    con: duckdb.DuckDBPyConnection, run_id: int, capture: Capture, ranks: set[int]
) -> None:
    """Insert the collector's collective records and per-step memory peaks of `ranks`."""
    coll_rows: list[list[Any]] = []
    mem_rows: list[list[Any]] = []
    for rank in sorted(ranks):
        entry = capture.ranks.get(rank, {})
        rel = entry.get("collectives")
        if rel:
            path = capture.root / rel
            if path.is_file():
                for rec in read_collectives(path):
                    values = [rec.get(k) for k in _COLLECTIVE_FIELDS]
                    values[0] = values[0] or "collector"
                    if values[4] is not None:
                        values[4] = json.dumps(values[4])
                    coll_rows.append([run_id, rank, *values])
        for peak in entry.get("memory") or []:
            device_type = 1 if str(peak.get("device_type", "cpu")).startswith("cuda") else 0
            allocated = peak.get("peak_allocated_bytes")
            if allocated is None:
                allocated = peak.get("rss_bytes")
            mem_rows.append([
                run_id, rank, "step_peak", int(peak.get("ts_ns") or 0), peak.get("step"),
                device_type, peak.get("device_id"), None, allocated,
                peak.get("peak_reserved_bytes"),
            ])
    if coll_rows:
        con.executemany(
            """INSERT INTO collectives (run_id, rank, source, op, pg_name, pg_desc, pg_ranks,
               group_size, seq, in_bytes, out_bytes, dtype, peer, enqueue_ns, start_ns, end_ns,
               step, event_idx)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)""",
            coll_rows,
        )
    if mem_rows:
        con.executemany(
            "INSERT INTO memory VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", mem_rows
        )
