"""The runs in the store, a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.views import PAGE_ROWS

RUNS_SQL = """
WITH page AS (
    SELECT run_id, name, created_at, rank_count, world_size, json_array_length(skipped) AS skipped
    FROM runs ORDER BY run_id DESC LIMIT ? OFFSET ?
),
st AS (
    SELECT s.run_id, count(DISTINCT s.step) AS steps, min(s.start_ns) AS t0,
           max(coalesce(s.device_end_ns, s.end_ns)) AS t1,
           median(coalesce(s.device_end_ns, s.end_ns) - s.start_ns) AS step_ns
    FROM steps s JOIN page USING (run_id) GROUP BY s.run_id
),
ev AS (
    SELECT k.run_id, sum(k.event_count) AS events, string_agg(DISTINCT k.backend, ', ') AS backend,
           string_agg(DISTINCT k.device, ', ') AS device
    FROM ranks k JOIN page USING (run_id) GROUP BY k.run_id
)
SELECT page.run_id, page.name, page.created_at, page.rank_count, page.world_size,
       coalesce(st.steps, 0), (st.t1 - st.t0) / 1e6, st.step_ns / 1e6, ev.events, ev.backend,
       ev.device, page.skipped
FROM page LEFT JOIN st USING (run_id) LEFT JOIN ev USING (run_id)
ORDER BY page.run_id DESC
"""

_KEYS = ("run_id", "name", "created_at", "ranks", "world_size", "steps", "span_ms",
         "median_step_ms", "events", "backend", "device", "skipped")


@dataclass(frozen=True, kw_only=True)
class RunsPage:
    rows: list[dict[str, Any]]
    total: int
    page: int
    page_rows: int


def runs_page(con: duckdb.DuckDBPyConnection, page: int = 1, page_rows: int = PAGE_ROWS) -> RunsPage:
    """Runs newest first: ranks, steps, profiled span (first step start to last step end) and
    median step time (over ranks and steps)."""
    row = con.execute("SELECT count(*) FROM runs").fetchone()
    total = int(row[0]) if row else 0
    page = max(1, min(page, max(1, -(-total // page_rows))))
    rows = con.execute(RUNS_SQL, [page_rows, (page - 1) * page_rows]).fetchall()
    out = []
    for row in rows:
        d = dict(zip(_KEYS, row, strict=True))
        d["created_at"] = str(d["created_at"])[:19]
        out.append(d)
    return RunsPage(rows=out, total=total, page=page, page_rows=page_rows)


def newest_run_ids(con: duckdb.DuckDBPyConnection, count: int) -> list[int]:
    """Ids of the `count` newest runs, newest first."""
    rows = con.execute("SELECT run_id FROM runs ORDER BY run_id DESC LIMIT ?", [count]).fetchall()
    return [int(r[0]) for r in rows]


def run_names(con: duckdb.DuckDBPyConnection, limit: int = 500) -> list[str]:
    """Names of the newest runs (for pickers), newest first."""
    rows = con.execute("SELECT name FROM runs ORDER BY run_id DESC LIMIT ?", [limit]).fetchall()
    return [str(r[0]) for r in rows]
