"""The facts every view needs about one run: its ranks, their clock offsets, and its time origin."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

import duckdb

from tracelab.errors import RunNotFoundError
from tracelab.views._sql import OFFSETS, query


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """One run as the views see it. Times are ns on the aligned clock."""

    run_id: int
    name: str
    created_at: dt.datetime
    world_size: int | None
    ranks: tuple[int, ...]
    #: rank -> offset of its clock relative to the reference (aligned = local - offset).
    offsets_ns: Mapping[int, int] = field(default_factory=dict)
    #: Where the offsets came from: 'measured', 'estimated', 'same_host' or 'none'.
    offset_source: str = "none"
    #: First event start and last event end of the run, aligned.
    origin_ns: int = 0
    end_ns: int = 0
    event_count: int = 0

    @property
    def span_ms(self) -> float:
        return (self.end_ns - self.origin_ns) / 1e6

    def params(self) -> dict[str, object]:
        """Named parameters every view query shares: $run and the offsets ($off_ranks, $off_ns)."""
        ranks = list(self.ranks)
        return {
            "run": self.run_id,
            "off_ranks": ranks,
            "off_ns": [int(self.offsets_ns.get(r, 0)) for r in ranks],
        }

    def to_ms(self, ns: float) -> float:
        """Aligned ns -> ms since the run's first event. Integer arithmetic first: epoch ns
        (~1.7e18) do not fit a float's 53 bits, so float(ns) alone would be off by up to 256 ns."""
        whole = int(ns)
        return ((whole - self.origin_ns) + (float(ns) - whole)) / 1e6

    def to_ns(self, ms: float) -> int:
        """ms since the run's first event -> aligned ns."""
        return self.origin_ns + round(ms * 1e6)


def _offsets(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[dict[int, int], str]:
    """Per-rank clock offsets from the derived layer (clock_offsets, docs/metrics.md "Clocks"),
    so findings' time ranges line up, and how they were obtained: 'measured' (collector),
    'estimated' (matched collectives), 'same_host' (one host, one clock) or 'none'."""
    rows = con.execute(
        "SELECT rank, offset_ns, method FROM clock_offsets WHERE run_id = ?", [run_id]
    ).fetchall()
    methods = {str(m) for _, _, m in rows} - {"reference"}
    if "collectives" in methods:
        source = "estimated"
    elif "collector" in methods:
        source = "measured"
    elif "same_host" in methods or (rows and not methods):
        source = "same_host"
    else:
        source = "none"
    return {int(r): int(o) for r, o, _ in rows}, source


#: The run's first event start, last event end (aligned) and events.
_EXTENTS_SQL = f"""
SELECT min(x.first_ns - o.off_ns), max(x.end_ns - o.off_ns), sum(x.events)
FROM rank_extents x JOIN {OFFSETS} o USING (rank)
WHERE x.run_id = $run
"""
_EVENTS_SPAN_SQL = f"""
SELECT min(e.ts_ns - o.off_ns), max(e.ts_ns + e.dur_ns - o.off_ns), count(*)
FROM events e JOIN {OFFSETS} o USING (rank)
WHERE e.run_id = $run
"""


def run_context(con: duckdb.DuckDBPyConnection, run_id: int) -> RunContext:
    """Load the context of run `run_id`, with its clock offsets."""
    row = con.execute(
        "SELECT name, created_at, world_size FROM runs WHERE run_id = ?", [run_id]
    ).fetchone()
    if row is None:
        raise RunNotFoundError(f"no run with id {run_id} in the store (was it deleted?).")
    rank_rows = con.execute(
        "SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]
    ).fetchall()
    offsets, source = _offsets(con, run_id)
    ranks = tuple(int(r[0]) for r in rank_rows)
    params = {
        "run": run_id,
        "off_ranks": list(ranks),
        "off_ns": [offsets.get(r, 0) for r in ranks],
    }
    # From each rank's extent (rank_extents); from the events where the run has none (its
    # parts could not be derived): their scan read every rank's file, 2.7 s at 10,000 ranks.
    span = query(con, _EXTENTS_SQL, params)[0]
    if span[0] is None:
        span = query(con, _EVENTS_SPAN_SQL, params)[0]
    origin, end, count = span if span[0] is not None else (0, 0, 0)
    return RunContext(
        run_id=run_id,
        name=str(row[0]),
        created_at=row[1],
        world_size=row[2],
        ranks=ranks,
        offsets_ns=offsets,
        offset_source=source,
        origin_ns=int(origin),
        end_ns=int(end),
        event_count=int(count),
    )


def run_by_name(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """run_id of the run called `name` (RunNotFoundError listing the known runs otherwise)."""
    from tracelab.store import run_id

    return run_id(con, name)
