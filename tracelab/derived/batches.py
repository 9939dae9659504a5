"""Batches of a run's ranks, for the work that is per rank and grows with events: done a batch
at a time, its memory stays bounded however many ranks the run has (every relation that reads
events filters on the batch's ranks, so only their Parquet files are read)."""

from __future__ import annotations

import os

import duckdb

#: The most events one batch of ranks (of tracelab.derived.parts.derive, of the breakdown's
#: HTA figures) holds in memory at once; TRACELAB_DERIVE_BATCH_EVENTS overrides it. A rank's
#: intervals depend on its own events and on the small cross-rank tables only.
BATCH_EVENTS = int(os.environ.get("TRACELAB_DERIVE_BATCH_EVENTS", 4_000_000))

#: Every rank: the (lo, hi) of a single batch.
ALL_RANKS = (-(2**31), 2**31 - 1)


def rank_batches(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    batch_events: int | None = None,
    parts: int = 1,
    least: int = 1,
) -> list[tuple[int, int]]:
    """Consecutive rank ranges (lo, hi) covering every rank, each holding at most
    `batch_events` events (default BATCH_EVENTS; or one rank, whichever is more), from the
    catalog's row counts; and at most 1/`parts` of the run's events (so that `parts` workers
    share the run) where the ranks allow, but not below `least` events a batch (a batch's
    fixed cost outweighs sharing a small run)."""
    batch_events = BATCH_EVENTS if batch_events is None else batch_events
    counts = con.execute(
        "SELECT rank, sum(row_count) FROM parquet_files WHERE run_id = $run AND kind = 'events' "
        "GROUP BY rank ORDER BY rank",
        {"run": run_id},
    ).fetchall()
    if parts > 1:
        total = sum(int(n) for _, n in counts)
        batch_events = min(batch_events, max(least, -(-total // parts)))
    bounds: list[tuple[int, int]] = []
    lo, held = ALL_RANKS[0], 0
    for rank, n in counts:
        if held and held + int(n) > batch_events:
            bounds.append((lo, int(rank) - 1))
            lo, held = int(rank), 0
        held += int(n)
    bounds.append((lo, ALL_RANKS[1]))
    return bounds
