"""The allocator's growth over each pipeline action (tracelab.analyzers._memory_estimate), the
measured activation bytes of the memory estimate, on a store of the real schema."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracelab.analyzers._memory_estimate import forward_growth
from tracelab.connections import connect
from tracelab.store.files import make_root, rank_file, register_files
from tracelab.store.schema import schema_sql


@pytest.fixture
def con(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = connect(str(tmp_path / "s.duckdb"))  # (a file: its Parquet folder beside it)
    con.execute(schema_sql())
    return con


def _action(con: duckdb.DuckDBPyConnection, rank: int, mb: int, s0: int, s1: int) -> None:
    con.execute(
        "INSERT INTO pipeline_actions (run_id, rank, step, stage, kind, mb, span_start_ns, "
        "span_end_ns, start_ns, end_ns, busy_ns) VALUES (1, ?, 0, ?, 'F', ?, ?, ?, ?, ?, 0)",
        [rank, rank, mb, s0, s1, s0, s1],
    )


def _events(con: duckdb.DuckDBPyConnection, rank: int, *events: tuple[int, int]) -> None:
    """(time, allocated bytes after it), in the trace's order: the rank's memory file, as a
    conversion writes it (tracelab.ingest.convert), listed as a store lists it."""
    path = make_root(con) / rank_file(1, rank, "memory", 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "ts_ns": pa.array([ts for ts, _ in events], pa.int64()),
                "step": pa.array([None] * len(events), pa.int32()),
                "device_type": pa.array([0] * len(events), pa.int64()),
                "device_id": pa.array([0] * len(events), pa.int64()),
                "bytes": pa.array([None] * len(events), pa.int64()),
                "total_allocated": pa.array([b for _, b in events], pa.int64()),
                "total_reserved": pa.array([None] * len(events), pa.int64()),
            }
        ),
        path,
    )
    register_files(con, 1, [], [(rank, 0, len(events))])


def test_growth_is_from_before_the_start_to_the_end_inclusive(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # The event at the start belongs to the action (after it, not before); the event at the
    # end too; the one after the end does not.
    _action(con, 0, 0, 100, 200)
    _events(con, 0, (50, 1_000), (100, 1_500), (150, 4_000), (200, 3_000), (201, 9_999))
    [row] = forward_growth(con, 1, 0)
    assert row["grown_bytes"] == 3_000 - 1_000
    assert (row["s0"], row["s1"]) == (100, 200)


def test_of_events_at_one_instant_the_last_written_counts(con: duckdb.DuckDBPyConnection) -> None:
    # Three allocator events at 100 and two at 200, as a trace of microsecond times has them:
    # the state at an instant is after its last event, whatever order a scan finds them in.
    _action(con, 0, 0, 150, 200)
    _action(con, 0, 1, 100, 120)
    _events(con, 0, (100, 10), (100, 30), (100, 20), (200, 70), (200, 50))
    rows = forward_growth(con, 1, 0)
    assert [(r["s0"], r["grown_bytes"]) for r in rows] == [(100, None), (150, 50 - 20)]


def test_each_rank_reads_its_own_events_on_its_own_clock(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # The actions are on the reference clock, a rank's allocator events on its own: rank 1's
    # clock is 1,000 ns ahead (reference = own - offset), so its action [100, 200] spans
    # [1100, 1200] of its events' times. Rank 0's events at those times are not rank 1's.
    con.execute(
        "INSERT INTO clock_offsets (run_id, rank, offset_ns, method, reference_rank, matches, "
        "causality_violations) VALUES (1, 0, 0, 'reference', 0, 0, 0), "
        "(1, 1, 1000, 'collectives', 0, 3, 0)"
    )
    _action(con, 0, 0, 100, 200)
    _action(con, 1, 0, 100, 200)
    _events(con, 0, (90, 1), (190, 5), (1090, 40), (1190, 80))
    _events(con, 1, (90, 100), (190, 300), (1090, 1_000), (1190, 1_600))
    rows = forward_growth(con, 1, 0)
    assert [(r["rank"], r["s0"], r["grown_bytes"]) for r in rows] == [(0, 100, 4), (1, 1100, 600)]
